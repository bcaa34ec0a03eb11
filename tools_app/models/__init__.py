"""Models, one module per concept. The database is the source of truth."""

from tools_app.models.audit import AuditEvent
from tools_app.models.business import Order, OrderLine, Ticket
from tools_app.models.documents import Document, DocumentChunk
from tools_app.models.idempotency import ErrorClass, IdempotencyRecord, RecordStatus
from tools_app.models.metrics import CallEvent, CallOutcome
from tools_app.models.tasks import Checkpoint, StepOutcome, StepRun, Task, TaskArtifact, TaskStatus
from tools_app.models.tenants import ApiToken, Tenant, TenantAccess

__all__ = [
    "ApiToken",
    "AuditEvent",
    "CallEvent",
    "CallOutcome",
    "Checkpoint",
    "Document",
    "DocumentChunk",
    "ErrorClass",
    "IdempotencyRecord",
    "Order",
    "OrderLine",
    "RecordStatus",
    "StepOutcome",
    "StepRun",
    "Task",
    "TaskArtifact",
    "TaskStatus",
    "Tenant",
    "TenantAccess",
    "Ticket",
]
