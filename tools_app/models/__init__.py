"""Models, one module per concept. The database is the source of truth."""

from tools_app.models.announcements import Announcement
from tools_app.models.approvals import (
    ApprovalDecision,
    ApprovalRequest,
    ApprovalSettings,
    ApprovalStatus,
    ApprovalVerdict,
    PendingApproval,
)
from tools_app.models.audit import AuditEvent
from tools_app.models.audit_chain import AuditSeal
from tools_app.models.auditors import AuditorKey
from tools_app.models.business import Order, OrderLine, Ticket
from tools_app.models.dashboard import Dashboard
from tools_app.models.documents import Document, DocumentChunk
from tools_app.models.idempotency import ErrorClass, IdempotencyRecord, RecordStatus, UnknownOutcome
from tools_app.models.metrics import CallEvent, CallOutcome
from tools_app.models.outbox import DeadLetter, OutboxEvent, OutboxStatus
from tools_app.models.tasks import (
    Checkpoint,
    StepOutcome,
    StepRun,
    Task,
    TaskArtifact,
    TaskNeedingAttention,
    TaskStatus,
)
from tools_app.models.tenants import ApiToken, Tenant, TenantAccess

__all__ = [
    "Announcement",
    "ApiToken",
    "ApprovalDecision",
    "ApprovalRequest",
    "ApprovalSettings",
    "ApprovalStatus",
    "ApprovalVerdict",
    "AuditEvent",
    "AuditSeal",
    "AuditorKey",
    "CallEvent",
    "CallOutcome",
    "Checkpoint",
    "Dashboard",
    "DeadLetter",
    "Document",
    "DocumentChunk",
    "ErrorClass",
    "IdempotencyRecord",
    "Order",
    "OrderLine",
    "OutboxEvent",
    "OutboxStatus",
    "PendingApproval",
    "RecordStatus",
    "StepOutcome",
    "StepRun",
    "Task",
    "TaskArtifact",
    "TaskNeedingAttention",
    "TaskStatus",
    "Tenant",
    "TenantAccess",
    "Ticket",
    "UnknownOutcome",
]
