"""Models, one module per concept. The database is the source of truth."""

from tools_app.access.models import ApiToken, AuditorKey, Tenant, TenantAccess
from tools_app.approvals.models import (
    ApprovalDecision,
    ApprovalRequest,
    ApprovalSettings,
    ApprovalStatus,
    ApprovalVerdict,
    PendingApproval,
)
from tools_app.core.errors import ErrorClass
from tools_app.core.models import AuditEvent, AuditSeal, MetricMinute, MetricTotal
from tools_app.documents.models import Document, DocumentChunk
from tools_app.engine.models import IdempotencyRecord, PreparedOperation, RecordStatus
from tools_app.metrics.models import Dashboard
from tools_app.outbox.models import DeadLetter, OutboxEvent, OutboxStatus
from tools_app.reconciliation.models import UnknownOutcome
from tools_app.tasks.models import (
    Checkpoint,
    StepOutcome,
    StepRun,
    Task,
    TaskArtifact,
    TaskNeedingAttention,
    TaskStatus,
)
from tools_app.toolkit.calls import CallOutcome
from tools_app.tools.models import Announcement, Order, OrderLine, Ticket

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
    "CallOutcome",
    "Checkpoint",
    "Dashboard",
    "DeadLetter",
    "Document",
    "DocumentChunk",
    "ErrorClass",
    "IdempotencyRecord",
    "MetricMinute",
    "MetricTotal",
    "Order",
    "OrderLine",
    "OutboxEvent",
    "OutboxStatus",
    "PendingApproval",
    "PreparedOperation",
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
