"""A scheduled operation (a tool call at a time or on a cron rule) and its occurrences."""

from django.db import models

from tools_app.core.personal import PersonalJSONField


class Overlap(models.TextChoices):
    SKIP = "skip", "Skip a tick while the previous occurrence still runs"
    QUEUE = "queue", "Queue it: it runs once the previous occurrence ends"


class ScheduledOperation(models.Model):
    """One tool call, scheduled by an operator or an agent: once at `run_at`, or on `cron` (UTC).

    Each tick is a ScheduledRun whose idempotency key is the schedule's id and the tick's time, so a
    tick found twice (two clusters, a redelivered job) runs once: the engine's claim of that key.
    Changed only through tools_app.scheduling.operations (authorized, audited).
    """

    tenant = models.ForeignKey("tools_app.Tenant", on_delete=models.CASCADE, related_name="+")
    tool = models.CharField(max_length=200)
    arguments = PersonalJSONField(default=dict, help_text="The call's arguments, without its idempotency_key "
                                                         "(personal values encrypted: core.personal).")
    cron = models.CharField(max_length=120, blank=True, help_text="A cron rule (5 fields, or 6 with seconds "
                                                                  "last), in UTC; empty: once, at run_at.")
    run_at = models.DateTimeField(null=True, blank=True, help_text="A one-time operation's time.")
    overlap = models.CharField(max_length=8, choices=Overlap.choices, default=Overlap.SKIP)
    backfill = models.PositiveIntegerField(default=0, help_text="Missed ticks (the cluster was down) run "
                                                                "afterwards, the latest first; older ones are "
                                                                "recorded as skipped.")
    paused = models.BooleanField(default=False)
    next_tick_at = models.DateTimeField(null=True, blank=True, help_text="Empty once a one-time operation ran.")
    created_by = models.CharField(max_length=200, help_text="Who scheduled it: its calls run as them.")
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "scheduled operation"
        indexes = [models.Index(fields=["next_tick_at"], name="schedule_due",
                                condition=models.Q(paused=False, next_tick_at__isnull=False))]
        permissions = [("manage_schedules", "Can schedule, pause and resume operations")]

    def __str__(self) -> str:
        return f"{self.tool} {'on ' + self.cron if self.cron else 'at ' + str(self.run_at)}"


class RunStatus(models.TextChoices):
    QUEUED = "queued", "Queued"
    RUNNING = "running", "Running"
    DONE = "done", "Called: its outcome is the operation's"
    SKIPPED = "skipped", "Skipped"


class ScheduledRun(models.Model):
    """One occurrence (tick) of a scheduled operation."""

    schedule = models.ForeignKey(ScheduledOperation, on_delete=models.CASCADE, related_name="runs")
    tick_at = models.DateTimeField()
    key = models.CharField(max_length=255, help_text="The call's idempotency key: the schedule and the tick.")
    status = models.CharField(max_length=8, choices=RunStatus.choices, default=RunStatus.QUEUED)
    outcome = models.CharField(max_length=32, blank=True, help_text="The call's outcome (executed, replayed, "
                                                                    "failed, ...) or why it was skipped.")
    error_class = models.CharField(max_length=32, blank=True)
    operation_id = models.UUIDField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-tick_at"]
        constraints = [models.UniqueConstraint(fields=["schedule", "tick_at"], name="one_run_per_tick")]
        indexes = [models.Index(fields=["schedule", "status"], name="schedule_run_status")]

    def __str__(self) -> str:
        return f"{self.key} ({self.status})"
