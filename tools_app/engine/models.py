from django.contrib.postgres.indexes import GinIndex
from django.db import models
from django.db.models import Q, Value

from tools_app.core.errors import ErrorClass
from tools_app.core.personal import PersonalJSONField


class RecordStatus(models.TextChoices):
    PROCESSING = "processing", "Processing"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    UNKNOWN = "unknown", "Unknown outcome"
    AWAITING_APPROVAL = "awaiting_approval", "Awaiting approval"


class IdempotencyRecord(models.Model):
    """One business operation: (tenant, tool, idempotency key) and what became of it.

    The row is claimed by a single INSERT against the partial unique constraint
    below; every later change is a conditional UPDATE in tools_app.engine.
    A record past its retention may be *retired* (retired_at set), which frees
    its key for a new operation while keeping the old row for auditors.
    """

    # No index of its own: record_tenant_created leads with tenant (one index less to write per claim).
    tenant = models.ForeignKey("tools_app.Tenant", on_delete=models.PROTECT, related_name="records",
                               db_index=False)
    tool = models.CharField(max_length=100)
    key = models.CharField(max_length=255)
    fingerprint = models.CharField(max_length=64, help_text="SHA-256 of the canonical business arguments.")
    fingerprint_version = models.PositiveSmallIntegerField(
        default=1, help_text="What the fingerprint covers (core.keys): 1, every default filled in; 2, what the caller "
                             "sent; 3 and up, that plus the tool's declared defaults. A call is compared under it.")
    field_digests = models.JSONField(
        default=dict, help_text="Digest per top-level argument, to name what differs on a conflict."
    )
    arguments = PersonalJSONField(default=dict, help_text="The business arguments (canonical form; personal "
                                                          "values encrypted: core.personal).")
    status = models.CharField(max_length=24, choices=RecordStatus.choices, default=RecordStatus.PROCESSING)
    result = PersonalJSONField(null=True, blank=True, help_text="What the first call returned; replays return it "
                                                                "(personal values encrypted).")
    error_class = models.CharField(max_length=32, choices=ErrorClass.choices, blank=True)
    error_message = models.TextField(blank=True)
    retry_not_before = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=1)
    uncertain_runs = models.PositiveIntegerField(
        default=0, help_text="Runs whose outcome was uncertain or unexpected (a timeout after sending, an internal "
                             "error, a lost lease): IDEMOPS_MAX_ATTEMPTS_PER_KEY caps these alone.")
    retry_until = models.DateTimeField(
        null=True, blank=True, help_text="Set by the first run the downstream refused before acting: until then "
                                         "the key may run again; past it the record is FAILED (not_executed).")
    lease_owner = models.CharField(max_length=100, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    operation_id = models.UUIDField(unique=True, help_text="Stable id of this operation, sent downstream.")
    trace_id = models.CharField(max_length=100, blank=True, help_text="The call's trace (W3C trace id).")
    span_id = models.CharField(max_length=16, blank=True, help_text="The call's span: what later work on the "
                                                                    "record (reconciliation, approved execution) "
                                                                    "is traced under.")
    actor = models.CharField(max_length=200, blank=True, help_text="Who called (agent identity).")
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(help_text="End of retention; what happens after is the tool's policy.")
    ongoing = models.BooleanField(
        default=False, help_text="The call finished but the operation it started (a long task) goes on: until it "
                                 "ends, the key never expires; its end sets expires_at (engine.retain_from_end).")
    retired_at = models.DateTimeField(null=True, blank=True, help_text="Set when an expired key was reused.")
    purged_at = models.DateTimeField(null=True, blank=True, help_text="When its arguments and result were purged "
                                                                      "(past its retention; the row stays).")
    # Downstream systems and reconciliation (tools_app.reconciliation).
    downstream_key = models.CharField(
        max_length=100, blank=True, help_text="The key sent downstream: one per operation (derived from operation_id).")
    evidence = PersonalJSONField(default=list, blank=True,
                                help_text="What was asked downstream, what came back, when; newest last.")
    reconcile_attempts = models.PositiveIntegerField(default=0)
    next_reconcile_at = models.DateTimeField(null=True, blank=True)
    escalated_at = models.DateTimeField(null=True, blank=True, help_text="Automatic reconciliation gave up: "
                                                                         "a person must decide.")
    # The tool's declared search fields (non-personal: an order reference, a ticket number), as text.
    # A database default too: rows inserted by SQL that names no attributes (bulk loads) get {}.
    attributes = models.JSONField(
        default=dict, db_default=Value({}, models.JSONField()), blank=True,
        help_text="The tool's search fields from the arguments (set when claimed) and the result (added when it "
                  "succeeds): name -> value as text.")

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "tool", "key"],
                condition=Q(retired_at__isnull=True),
                name="one_live_record_per_key",
            ),
        ]
        indexes = [
            models.Index(fields=["status", "lease_expires_at"], name="record_status_lease"),
            models.Index(fields=["tenant", "created_at"], name="record_tenant_created"),
            models.Index(fields=["tool", "created_at"], name="record_tool_created"),
            # the console's filters (tools_app/admin/big_lists.py), each with the tenant scoping
            models.Index(fields=["tenant", "status", "created_at"], name="record_tenant_status"),
            models.Index(fields=["tenant", "error_class", "created_at"], condition=~Q(error_class=""),
                         name="record_tenant_error"),
            models.Index(fields=["tenant", "tool", "created_at"], name="record_tenant_tool"),
            models.Index(fields=["tenant", "finished_at"], name="record_tenant_finished"),
            models.Index(fields=["trace_id"], condition=~Q(trace_id=""), name="record_trace"),
            models.Index(fields=["next_reconcile_at"], condition=Q(status="unknown"), name="record_unknown_due"),
            # Finding a key's earlier operations (the console); written only when a record is retired.
            models.Index(fields=["tenant", "tool", "key"], condition=Q(retired_at__isnull=False),
                         name="record_retired_key"),
            # Finding records by a business attribute (`attributes @> '{"order_id": "42"}'`): Find, the
            # auditors' API, the bulk filters.
            GinIndex(fields=["attributes"], opclasses=["jsonb_path_ops"], name="record_attributes"),
        ]
        permissions = [
            ("resolve_unknown", "Can resolve UNKNOWN outcomes"),
            ("force_expire_idempotencyrecord", "Can force-expire an idempotency key"),
            ("release_held_key", "Can release an idempotency key held past its retention"),
            ("view_personal_values", "Can see the personal values of calls in the console (others see [personal])"),
        ]

    def __str__(self) -> str:
        return f"{self.tool} #{self.pk} ({self.status})"


class PreparedOperation(models.Model):
    """An operation id issued before the call (prepare_operation), for a tool that accepts no other key.

    Bound to (tenant, tool, fingerprint of the business arguments). Unused, it is valid while the
    record of the prepare call that issued it (`record`) is live and within its retention (so a
    replay of that call never answers an id that has lapsed). The first call with the id as its
    key claims a record whose operation_id *is* this id; from then on the id is that record's key
    and names that one operation everywhere (downstream, audit events, tasks). See
    engine/prepared.py.
    """

    operation_id = models.UUIDField(primary_key=True)
    # No index of its own: prepared_tool_fingerprint leads with tenant.
    tenant = models.ForeignKey("tools_app.Tenant", on_delete=models.PROTECT, db_index=False)
    tool = models.CharField(max_length=100, help_text="The tool the id may be used with.")
    fingerprint = models.CharField(max_length=64, help_text="SHA-256 of the canonical business arguments.")
    fingerprint_version = models.PositiveSmallIntegerField(default=1, help_text="As the record's.")
    field_digests = models.JSONField(default=dict, help_text="Digest per top-level argument, to name what differs.")
    record = models.ForeignKey(IdempotencyRecord, on_delete=models.PROTECT, related_name="prepared_operations",
                               help_text="The prepare_operation call that issued it.")
    actor = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["tenant", "tool", "fingerprint"], name="prepared_tool_fingerprint")]

    def __str__(self) -> str:
        return f"{self.tool} operation {self.operation_id}"
