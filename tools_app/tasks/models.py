"""Long tasks: a tool call that runs as a pipeline of steps on the job cluster.

A Task is created by `start_task` under the idempotency engine (one task per
operation: the one-to-one `record` is the business-level guard). Workers take
it by a conditional UPDATE of its lease; every finished step writes a
Checkpoint in the same transaction as the task's step advance, so a resumed
task starts at the first step without a valid checkpoint. StepRun keeps the
history of step executions (one row per start), which operators read and the
crash tests count. All state changes live in tools_app.tasks.
"""

import uuid

from django.db import models
from django.db.models import Q

from tools_app.core.personal import PersonalJSONField


class TaskStatus(models.TextChoices):
    CREATED = "created", "Created (queued)"
    RUNNING = "running", "Running"
    PAUSED = "paused", "Paused (waiting for a person or a dependency)"
    RETRYING = "retrying", "Retrying (backing off after a transient error)"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"


class Task(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey("tools_app.Tenant", on_delete=models.PROTECT, related_name="tasks")
    tool = models.CharField(max_length=100, help_text="The tool whose pipeline this task runs.")
    record = models.OneToOneField(
        "tools_app.IdempotencyRecord", on_delete=models.PROTECT, related_name="task",
        help_text="The start_task operation that created this task.")
    operation_id = models.UUIDField(null=True, blank=True, editable=False,
                                    help_text="Its record's operation_id: the id that names the operation everywhere.")
    arguments = PersonalJSONField(
        help_text="The tool's validated arguments, as they may be shown (URLs without their query).")
    sealed_arguments = models.TextField(
        blank=True, help_text="The arguments scrubbing changed, in full, encrypted (tools_app.core.redaction.seal): "
                              "what the steps read over `arguments`.")
    input_digest = models.CharField(max_length=64, help_text="SHA-256 of the canonical arguments.")
    status = models.CharField(max_length=16, choices=TaskStatus.choices, default=TaskStatus.CREATED)
    current_step = models.CharField(max_length=100, blank=True)
    completed_steps = models.JSONField(default=list, help_text="Names of the steps with a checkpoint, in order.")
    steps_total = models.PositiveIntegerField()
    progress_done = models.FloatField(null=True, blank=True)
    progress_total = models.FloatField(null=True, blank=True)
    progress_message = models.CharField(max_length=300, blank=True)
    attempts = models.PositiveIntegerField(default=1, help_text="Runs after transient failures count here.")
    max_attempts = models.PositiveIntegerField()
    lease_expiries = models.PositiveIntegerField(default=0, help_text="Times a worker died holding the lease.")
    failure_class = models.CharField(max_length=32, blank=True)
    failure_reason = models.TextField(blank=True)
    cause_fixed_at = models.DateTimeField(
        null=True, blank=True, help_text="An operator marked the cause of its internal_error fixed: it may be "
                                         "resumed once.")
    pause_reason = models.TextField(blank=True)
    pause_requested = models.TextField(
        blank=True, help_text="Set while a running task is asked to pause (the reason): its worker pauses it at the "
                              "next step boundary.")
    input_request = PersonalJSONField(
        null=True, blank=True, help_text="What a paused step asks for: {key: {message, schema}}.")
    pipeline_version = models.PositiveIntegerField(
        default=1, help_text="The version of its tool's pipeline it started with: it runs on that version only.")
    waiting_until = models.DateTimeField(
        null=True, blank=True, help_text="Parked in a durable wait (TaskWait): when the wait gives up. The sweep "
                                         "wakes it then; the awaited event wakes it sooner.")
    resume_input = PersonalJSONField(null=True, blank=True, help_text="The answer given when resuming.")
    next_retry_at = models.DateTimeField(null=True, blank=True)
    time_allowed = models.DurationField(
        null=True, blank=True, help_text="How long it may take: its tool's deadline, or the shorter one its caller "
                                         "asked for.")
    deadline_at = models.DateTimeField(
        null=True, blank=True, help_text="Unfinished by then, it ends (failed, with the reason): set when it starts, "
                                         "and again when resume_task runs a failed task anew.")
    lease_owner = models.CharField(max_length=100, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    version = models.PositiveIntegerField(default=1, help_text="Bumped by every state change.")
    result = PersonalJSONField(null=True, blank=True, help_text="The tool's result, once succeeded.")
    notify_url = models.CharField(
        max_length=500, blank=True, help_text="A webhook (on the allow-list) told when the task finishes, through "
                                              "the outbox.")
    forked_from = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.PROTECT, related_name="forks",
        help_text="The task this one re-runs from step `forked_at_step`, reusing its checkpoints before it.")
    forked_at_step = models.CharField(max_length=100, blank=True)
    trace_id = models.CharField(max_length=100, blank=True, help_text="The starting call's trace (W3C trace id).")
    span_id = models.CharField(max_length=16, blank=True, help_text="The starting call's span: the steps' spans "
                                                                    "hang under it.")
    actor = models.CharField(max_length=200, blank=True)
    enqueued_at = models.DateTimeField(null=True, blank=True, help_text="When a job for it was last queued.")
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    purged_at = models.DateTimeField(null=True, blank=True,
                                     help_text="When its arguments, result and answers were purged (retention).")
    artifacts_purged_at = models.DateTimeField(
        null=True, blank=True, help_text="When its checkpoints, step batches and artifacts were purged (retention).")

    class Meta:
        permissions = [("manage_task", "Can cancel, pause and resume long tasks")]
        indexes = [
            models.Index(fields=["status", "lease_expires_at"], name="task_status_lease"),
            models.Index(fields=["tenant", "created_at"], name="task_tenant_created"),
            # the console's filters (tools_app/admin/big_lists.py), each with the tenant scoping
            models.Index(fields=["tenant", "status", "created_at"], name="task_tenant_status"),
            models.Index(fields=["tenant", "tool", "created_at"], name="task_tenant_tool"),
            models.Index(fields=["tenant", "failure_class", "created_at"], condition=~Q(failure_class=""),
                         name="task_tenant_failure"),
            models.Index(fields=["tenant", "finished_at"], name="task_tenant_finished"),
            models.Index(fields=["trace_id"], condition=~Q(trace_id=""), name="task_trace"),
            models.Index(fields=["status", "updated_at"], name="task_status_updated"),
            # An agent's unfinished tasks, counted against its limit at each start (access.limits).
            models.Index(fields=["tenant", "actor"], name="task_unfinished_by_actor",
                         condition=Q(status__in=["created", "running", "paused", "retrying"])),
            # The sweep's search for unfinished tasks past their deadline (tools_app.tasks.jobs.sweep).
            models.Index(fields=["deadline_at"], name="task_unfinished_deadline",
                         condition=Q(status__in=["created", "running", "paused", "retrying"])),
            # The sweep's search for parked tasks whose wait is over (tools_app.tasks.waits.wake_due).
            models.Index(fields=["waiting_until"], name="task_parked_until",
                         condition=Q(status="paused", waiting_until__isnull=False)),
        ]
        constraints = [
            # A running task always has a lease holder; nothing else does.
            models.CheckConstraint(
                condition=Q(status="running", lease_owner__gt="", lease_expires_at__isnull=False)
                | (~Q(status="running") & Q(lease_owner="")),
                name="task_lease_iff_running"),
        ]

    def __str__(self) -> str:
        return f"{self.tool} task {self.pk} ({self.status})"

    @property
    def finished(self) -> bool:
        return self.status in (TaskStatus.SUCCEEDED, TaskStatus.FAILED, TaskStatus.CANCELLED)


class TaskArtifact(models.Model):
    """A step output too large to keep inline in its checkpoint."""

    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="artifacts")
    sha256 = models.CharField(max_length=64)
    size = models.PositiveBigIntegerField()
    data = models.BinaryField()
    created_at = models.DateTimeField()


class Checkpoint(models.Model):
    """A finished step's output, written in the transaction that advances the task.

    `input_digest` covers what the step read (the task's arguments, the step's
    version and the checksums of the outputs before it); `checksum` is the
    SHA-256 of the stored output. Resume trusts a checkpoint only when both
    still match.
    """

    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="checkpoints")
    step = models.CharField(max_length=100)
    sequence = models.PositiveIntegerField(help_text="The step's position in the pipeline, from 0.")
    input_digest = models.CharField(max_length=64)
    output_inline = models.TextField(blank=True, help_text="The output as JSON, when small.")
    artifact = models.ForeignKey(TaskArtifact, null=True, blank=True, on_delete=models.PROTECT)
    checksum = models.CharField(max_length=64, help_text="SHA-256 of the output's stored bytes.")
    finished_at = models.DateTimeField()

    class Meta:
        ordering = ["task", "sequence"]
        constraints = [models.UniqueConstraint(fields=["task", "sequence"], name="one_checkpoint_per_step")]

    def __str__(self) -> str:
        return f"{self.step} of {self.task_id}"


class StepBatch(models.Model):
    """One batch of a step that works in batches (StepContext.each_batch): its output, written in
    the transaction of the batch's effect, so a step that runs again skips the batches done.

    `input_digest` covers the step's inputs (as a checkpoint's does), the batch's position and
    its items: a batch recorded for other inputs is not reused.
    """

    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="step_batches")
    sequence = models.PositiveIntegerField(help_text="The step's position in the task's plan.")
    batch = models.PositiveIntegerField(help_text="The batch's position in the step, from 0.")
    input_digest = models.CharField(max_length=64)
    output = PersonalJSONField()
    checksum = models.CharField(max_length=64, help_text="SHA-256 of the output's canonical JSON.")
    finished_at = models.DateTimeField()

    class Meta:
        ordering = ["task", "sequence", "batch"]
        constraints = [models.UniqueConstraint(fields=["task", "sequence", "batch"], name="one_record_per_batch")]

    def __str__(self) -> str:
        return f"batch {self.batch} of step {self.sequence} of {self.task_id}"


class StepOutcome(models.TextChoices):
    RUNNING = "running", "Running (or its worker died)"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    INTERRUPTED = "interrupted", "Interrupted (cancelled or lease lost)"
    PAUSED = "paused", "Paused"


class StepRun(models.Model):
    """One execution start of one step: the history operators read."""

    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="step_runs")
    step = models.CharField(max_length=100)
    sequence = models.PositiveIntegerField()
    attempt = models.PositiveIntegerField(help_text="The task's attempt number when the step started.")
    worker = models.CharField(max_length=100)
    outcome = models.CharField(max_length=16, choices=StepOutcome.choices, default=StepOutcome.RUNNING)
    error = models.TextField(blank=True)
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    trace_id = models.CharField(max_length=100, blank=True, help_text="The task's trace.")

    class Meta:
        ordering = ["started_at", "id"]
        indexes = [models.Index(fields=["task", "sequence"], name="steprun_task_sequence")]

    def __str__(self) -> str:
        return f"{self.step} of {self.task_id} ({self.outcome})"


class TaskWait(models.Model):
    """A durable wait of a step (StepContext.wait_for_event, sleep_until): the n-th wait of the step at
    `sequence`. Its `until` is fixed when the step first reaches it, so the step, run again after the
    task is woken (or after a crash), finds the same wait and its answer."""

    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="waits")
    sequence = models.PositiveIntegerField(help_text="The step's position in the task's plan.")
    number = models.PositiveIntegerField(help_text="The wait's position in its step, from 0.")
    event = models.CharField(max_length=100, blank=True, help_text="The event awaited; empty: a timer.")
    key = models.CharField(max_length=200, blank=True, help_text="The event's correlation key.")
    description = models.CharField(max_length=200, blank=True, help_text="What is awaited, as the status says it.")
    since = models.DateTimeField()
    until = models.DateTimeField(help_text="When it gives up (a timer: when it ends).")
    ended_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=16, blank=True, help_text="received or timed_out, once ended.")

    class Meta:
        ordering = ["task", "sequence", "number"]
        constraints = [models.UniqueConstraint(fields=["task", "sequence", "number"], name="one_wait_per_place")]
        indexes = [models.Index(fields=["event", "key"], name="taskwait_open_event",
                                condition=Q(ended_at__isnull=True) & ~Q(event=""))]

    def __str__(self) -> str:
        return f"wait {self.number} of step {self.sequence} of {self.task_id}"


class TaskEvent(models.Model):
    """An event sent to waiting tasks (idemops.tools.send_event, POST /api/v1/task-events): one per
    tenant, event and correlation key, kept whether or not a task waits for it yet, so one sent before
    its wait begins is not lost, and one sent twice counts once (the unique constraint)."""

    tenant = models.ForeignKey("tools_app.Tenant", on_delete=models.CASCADE, related_name="task_events")
    event = models.CharField(max_length=100)
    key = models.CharField(max_length=200)
    payload = PersonalJSONField(null=True, blank=True)
    sender = models.CharField(max_length=200, blank=True)
    received_at = models.DateTimeField()

    class Meta:
        ordering = ["received_at", "id"]
        constraints = [models.UniqueConstraint(fields=["tenant", "event", "key"], name="one_event_per_key")]

    def __str__(self) -> str:
        return f"{self.event} {self.key}"


class TaskNeedingAttention(Task):
    """The operators' queue of failed or stuck tasks (same table, its own admin page):
    failed, paused, backing off, or running on a lease that ran out (a dead worker)."""

    class Meta:
        proxy = True
        verbose_name = "failed or stuck task"
        verbose_name_plural = "failed or stuck tasks"
