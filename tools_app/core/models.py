from django.contrib.postgres.fields import ArrayField
from django.db import models


class AuditEvent(models.Model):
    """An append-only record of a decision or a state change that matters.

    Written by tools_app.core.audit.record_event in the same transaction as the
    change it describes. The chain fields (seq, prev_hash, hash) are filled by
    the sealer in tools_app.audit, which links events in commit order so that
    an edited or deleted event breaks the chain.

    Stored in monthly partitions by created_at (tools_app.core.audit_partitions): in the
    database the primary key is (id, created_at), as a partitioned table requires; id alone
    stays unique (one identity sequence) and is the key Django uses.
    """

    # No index of its own: audit_tenant_created leads with tenant.
    tenant = models.ForeignKey("tools_app.Tenant", null=True, blank=True, on_delete=models.PROTECT, db_index=False)
    actor = models.CharField(max_length=200, help_text="agent:<tenant>/<token>, user:<username> or system:<job>")
    action = models.CharField(max_length=64)
    object_type = models.CharField(max_length=64)
    object_id = models.CharField(max_length=64)
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)
    reason = models.TextField(blank=True)
    trace_id = models.CharField(max_length=100, blank=True)
    operation_id = models.UUIDField(
        null=True, blank=True, help_text="The operation the event belongs to (its idempotency record's operation_id), "
                                         "for events about records, tasks, approval requests and outbox events.")
    created_at = models.DateTimeField(db_index=True)
    # Not a unique column: a partitioned table's unique index must hold its partition key. The sealer
    # gives each seq once under its lock, and verification finds a repeated or missing one.
    seq = models.BigIntegerField(null=True, blank=True, editable=False)
    prev_hash = models.CharField(max_length=64, blank=True, editable=False)
    hash = models.CharField(max_length=64, blank=True, editable=False)

    class Meta:
        ordering = ["id"]
        indexes = [
            models.Index(fields=["object_type", "object_id"], name="audit_object"),
            models.Index(fields=["tenant", "created_at"], name="audit_tenant_created"),
            # the console's filters (tools_app/admin/big_lists.py), each with the tenant scoping
            models.Index(fields=["tenant", "action", "created_at"], name="audit_tenant_action"),
            models.Index(fields=["tenant", "object_type", "created_at"], name="audit_tenant_type"),
            models.Index(fields=["tenant", "actor", "created_at"], name="audit_tenant_actor"),
            models.Index(fields=["object_id"], name="audit_object_id"),
            models.Index(fields=["trace_id"], condition=~models.Q(trace_id=""), name="audit_trace"),
            models.Index(fields=["operation_id"], condition=models.Q(operation_id__isnull=False),
                         name="audit_operation"),
            # The sealer's work list: small however long the chain grows.
            models.Index(fields=["id"], condition=models.Q(seq__isnull=True), name="audit_unsealed"),
            # The chain's order, for verification and archiving.
            models.Index(fields=["seq"], name="audit_seq"),
        ]

    def __str__(self) -> str:
        return f"{self.action} {self.object_type}:{self.object_id} by {self.actor}"


class AuditSeal(models.Model):
    """One run of the audit sealer: the chain's head after it.

    Append-only (a trigger refuses UPDATE and DELETE). The last seal says how
    long the chain must be, so deleting the newest events is detected too.
    """

    first_seq = models.BigIntegerField()
    last_seq = models.BigIntegerField(unique=True)
    last_hash = models.CharField(max_length=64)
    events = models.PositiveIntegerField()
    sealed_at = models.DateTimeField()

    class Meta:
        ordering = ["-last_seq"]

    def __str__(self) -> str:
        return f"seal {self.first_seq}..{self.last_seq}"


class AuditCheckpoint(models.Model):
    """A range of the chain found sound by `verify_audit_log`: its last seq and hash.

    Written after each verified range, each in its own commit, so a verification that
    dies resumes from the newest one (tools_app.core.audit.verify_incrementally) instead
    of starting again at seq 1. Only ranges that start from the genesis or from an earlier
    checkpoint are recorded: the checkpoints always cover one unbroken prefix of the chain.
    """

    first_seq = models.BigIntegerField()
    last_seq = models.BigIntegerField(db_index=True)
    last_hash = models.CharField(max_length=64)
    events = models.PositiveIntegerField()
    verified_at = models.DateTimeField()

    class Meta:
        ordering = ["-last_seq"]

    def __str__(self) -> str:
        return f"verified {self.first_seq}..{self.last_seq}"


class AuditArchive(models.Model):
    """A prefix of the chain moved out of the table to a file (tools_app.retention.audit_archive).

    Append-only (a trigger refuses UPDATE and DELETE). Its last seq and hash are where
    verification of what is kept starts; the file holds the archived events with their
    hashes (its first line says the range and its first and last chain hashes), so the
    archived range can be verified from the file alone.
    """

    first_seq = models.BigIntegerField()
    last_seq = models.BigIntegerField(unique=True)
    first_prev_hash = models.CharField(max_length=64, help_text="The hash the first archived event links to.")
    last_hash = models.CharField(max_length=64, help_text="The archived head: the kept chain links to it.")
    events = models.PositiveIntegerField()
    path = models.CharField(max_length=500, help_text="The JSON-lines file (a header line, then one event a line).")
    sha256 = models.CharField(max_length=64, help_text="The file's digest when it was written.")
    archived_at = models.DateTimeField()

    class Meta:
        ordering = ["-last_seq"]

    def __str__(self) -> str:
        return f"archived {self.first_seq}..{self.last_seq}"


class MetricMinute(models.Model):
    """What the platform counted in one minute, per tenant, tool, metric and label (tools_app.core.counters).

    The dashboard, its charts and any per-tenant question ("calls of tenant X to tool Y per
    hour last week") read these rows: tools_app.metrics.rollup.series. Kept IDEMOPS_METRICS_RETENTION_DAYS.
    """

    minute = models.DateTimeField(help_text="Start of the minute (UTC).")
    tenant_id = models.BigIntegerField(default=0, help_text="0: work of no tenant.")
    tool = models.CharField(max_length=100, blank=True)
    metric = models.CharField(max_length=32, help_text="A name of tools_app.core.counters.METRICS.")
    label = models.CharField(max_length=100, blank=True, help_text="The outcome, result or step counted.")
    count = models.BigIntegerField(default=0)
    sum = models.FloatField(default=0, help_text="A histogram's total of seconds.")
    buckets = ArrayField(models.BigIntegerField(), null=True, blank=True,
                         help_text="A histogram's count per bucket (its bounds, then above the last).")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["minute", "tenant_id", "tool", "metric", "label"],
                                               name="one_metric_row_a_minute")]

    def __str__(self) -> str:
        return f"{self.metric} {self.tool} {self.label} at {self.minute:%Y-%m-%d %H:%M}"


class MetricTotal(models.Model):
    """Everything counted since the database was created, per tenant, tool, metric and label:
    what `/metrics` serves as Prometheus counters and histograms (never reset, never pruned)."""

    tenant_id = models.BigIntegerField(default=0)
    tool = models.CharField(max_length=100, blank=True)
    metric = models.CharField(max_length=32)
    label = models.CharField(max_length=100, blank=True)
    count = models.BigIntegerField(default=0)
    sum = models.FloatField(default=0)
    buckets = ArrayField(models.BigIntegerField(), null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["metric", "tool", "label", "tenant_id"],
                                               name="one_metric_total")]

    def __str__(self) -> str:
        return f"{self.metric} {self.tool} {self.label}: {self.count}"
