"""Models, one module per concept. The database is the source of truth."""

from tools_app.models.audit import AuditEvent
from tools_app.models.auditors import AuditorKey
from tools_app.models.business import Order, OrderLine, Ticket
from tools_app.models.idempotency import ErrorClass, IdempotencyRecord, RecordStatus
from tools_app.models.metrics import CallEvent, CallOutcome
from tools_app.models.tenants import ApiToken, Tenant, TenantAccess

__all__ = [
    "ApiToken",
    "AuditEvent",
    "AuditorKey",
    "CallEvent",
    "CallOutcome",
    "ErrorClass",
    "IdempotencyRecord",
    "Order",
    "OrderLine",
    "RecordStatus",
    "Tenant",
    "TenantAccess",
    "Ticket",
]
