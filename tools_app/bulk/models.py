"""A bulk action: one operator's confirmed action over a frozen selection, run by the cluster in batches."""

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models import Q


class BulkState(models.TextChoices):
    RUNNING = "running", "Running"
    STOPPING = "stopping", "Stopping (after the current batch)"
    STOPPED = "stopped", "Stopped"
    DONE = "done", "Done"


class BulkAction(models.Model):
    """Who confirmed what over which filter; its items (BulkItem) are the selection, frozen at confirmation.

    Its state moves only through tools_app.bulk.actions (`_move`: a guarded UPDATE with its audit event);
    `done` and `failed` are counted from its items after each batch.
    """

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+",
                             help_text="Who confirmed it: every item runs with their permissions.")
    actor = models.CharField(max_length=200)
    target = models.CharField(max_length=32, help_text="What it acts on (tools_app.bulk.selection.Target).")
    action = models.CharField(max_length=32, help_text="The action on each item (tools_app.bulk.actions.ACTIONS).")
    filter = models.JSONField(default=dict, help_text="The filter the selection matched when it was confirmed.")
    reason = models.TextField(blank=True)
    total = models.PositiveIntegerField(default=0)
    done = models.PositiveIntegerField(default=0, help_text="Items the action was applied to.")
    failed = models.PositiveIntegerField(default=0, help_text="Items refused or gone (each with its message).")
    state = models.CharField(max_length=16, choices=BulkState.choices, default=BulkState.RUNNING)
    tenant_ids = ArrayField(models.IntegerField(), default=list, help_text=(
        "The tenants of its selection: an operator sees it, and may stop it, only if they see every one."))
    stepped_up = models.BooleanField(default=False, help_text="The selection held a money tool: confirmed with a "
                                                              "fresh second-factor code.")
    created_at = models.DateTimeField()
    progress_at = models.DateTimeField(help_text="When a batch last finished (or it started): the sweep queues "
                                                 "it again when this is older than IDEMOPS_BULK_STALL_MINUTES.")
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        permissions = [("run_bulk_action", "Can run bulk actions over a filtered selection")]
        indexes = [models.Index(fields=["progress_at"], condition=Q(state__in=["running", "stopping"]),
                                name="bulk_unfinished")]

    def __str__(self) -> str:
        return f"bulk {self.action} #{self.pk} ({self.state})"


class BulkItem(models.Model):
    """One selected object (its primary key as text) and what the action did to it."""

    PENDING, DONE, FAILED = "", "done", "failed"

    bulk = models.ForeignKey(BulkAction, on_delete=models.CASCADE, related_name="items", db_index=False)
    object_id = models.CharField(max_length=64)
    outcome = models.CharField(max_length=8, blank=True, default="")
    message = models.TextField(blank=True, default="")

    class Meta:
        indexes = [models.Index(fields=["bulk", "outcome", "id"], name="bulk_item_outcome")]
