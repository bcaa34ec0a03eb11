"""Models, one module per concept. The database is the source of truth."""

from tools_app.models.audit import AuditEvent
from tools_app.models.business import Order, OrderLine, Ticket
from tools_app.models.idempotency import ErrorClass, IdempotencyRecord, RecordStatus, UnknownOutcome
from tools_app.models.metrics import CallEvent, CallOutcome
from tools_app.models.outbox import DeadLetter, OutboxEvent, OutboxStatus
from tools_app.models.tenants import ApiToken, Tenant, TenantAccess

__all__ = [
    "ApiToken",
    "AuditEvent",
    "DeadLetter",
    "CallEvent",
    "CallOutcome",
    "ErrorClass",
    "IdempotencyRecord",
    "Order",
    "OutboxEvent",
    "OutboxStatus",
    "OrderLine",
    "RecordStatus",
    "Tenant",
    "TenantAccess",
    "Ticket",
    "UnknownOutcome",
]
