from django.db import models


class CallOutcome(models.TextChoices):
    EXECUTED = "executed", "Executed (first call)"
    REPLAYED = "replayed", "Replayed a stored result"
    CONFLICT = "conflict", "Key reused with other parameters"
    IN_PROGRESS = "in_progress", "Answered in_progress after waiting"
    FAILED = "failed", "Failed"
    UNKNOWN = "unknown", "Outcome unknown"
    PENDING_APPROVAL = "pending_approval", "Held for a person's approval"
    REJECTED = "rejected", "Rejected before execution (input, auth, expiry)"
    READ = "read", "Read tool"


class CallEvent(models.Model):
    """One MCP tool call, for the dashboard's rates. Written in batches.

    Not an audit record: replays and conflicts change no state, so they are
    counted here off the request path instead of costing a write each.
    """

    tenant_id = models.BigIntegerField(null=True)
    tool = models.CharField(max_length=100)
    outcome = models.CharField(max_length=16, choices=CallOutcome.choices)
    error_class = models.CharField(max_length=32, blank=True)
    latency_ms = models.FloatField()
    created_at = models.DateTimeField(db_index=True)

    class Meta:
        indexes = [models.Index(fields=["tool", "created_at"], name="callevent_tool_created")]
