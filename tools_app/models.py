"""Models, one module per concept. The database is the source of truth."""

from tools_app.access.models import (
    AgentConnection,
    ApiToken,
    AuditorKey,
    RateBucket,
    Tenant,
    TenantAccess,
    TenantLimits,
)
from tools_app.approvals.confirmations import Confirmation, ConfirmationStatus
from tools_app.approvals.models import (
    ApprovalDecision,
    ApprovalLink,
    ApprovalQueue,
    ApprovalRequest,
    ApprovalSettings,
    ApprovalStatus,
    ApprovalVerdict,
)
from tools_app.bulk.models import BulkAction, BulkItem, BulkState
from tools_app.core.errors import ErrorClass
from tools_app.core.models import AuditArchive, AuditCheckpoint, AuditEvent, AuditSeal, MetricMinute, MetricTotal
from tools_app.engine.models import IdempotencyRecord, PreparedOperation, RecordStatus
from tools_app.incidents.models import Downstream, DownstreamSlot, Pause
from tools_app.metrics.models import Dashboard
from tools_app.outbox.models import DeadLetter, NotificationChannel, OutboxEvent, OutboxStatus
from tools_app.reconciliation.models import UnknownOutcomeQueue
from tools_app.retention.models import AuditRetention, RetentionOverride
from tools_app.scheduling.models import Overlap, RunStatus, ScheduledOperation, ScheduledRun
from tools_app.tasks.models import (
    Checkpoint,
    StepBatch,
    StepOutcome,
    StepRun,
    Task,
    TaskArtifact,
    TaskEvent,
    TaskNeedingAttention,
    TaskStatus,
    TaskWait,
)
from tools_app.toolkit.calls import CallOutcome

__all__ = [
    "Confirmation", "ConfirmationStatus",
    "BulkAction", "BulkItem", "BulkState",
    "Overlap", "RunStatus", "ScheduledOperation", "ScheduledRun",
    "Downstream",
    "DownstreamSlot",
    "Pause",
    "AgentConnection",
    "ApiToken",
    "ApprovalDecision",
    "ApprovalLink",
    "ApprovalQueue",
    "ApprovalRequest",
    "ApprovalSettings",
    "ApprovalStatus",
    "ApprovalVerdict",
    "AuditArchive",
    "AuditCheckpoint",
    "AuditEvent",
    "AuditRetention",
    "AuditSeal",
    "AuditorKey",
    "CallOutcome",
    "Checkpoint",
    "Dashboard",
    "DeadLetter",
    "ErrorClass",
    "IdempotencyRecord",
    "MetricMinute",
    "MetricTotal",
    "NotificationChannel", "OutboxEvent",
    "OutboxStatus",
    "PreparedOperation",
    "RateBucket",
    "RecordStatus",
    "RetentionOverride",
    "StepBatch",
    "StepOutcome",
    "StepRun",
    "Task",
    "TaskArtifact",
    "TaskEvent",
    "TaskWait",
    "TaskNeedingAttention",
    "TaskStatus",
    "Tenant",
    "TenantAccess",
    "TenantLimits",
    "UnknownOutcomeQueue",
]
