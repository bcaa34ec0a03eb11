import uuid

from django.db import models

from tools_app.core.personal import PersonalJSONField


class OutboxStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    DELIVERED = "delivered", "Delivered"
    DEAD = "dead", "Dead-lettered"


class OutboxEvent(models.Model):
    """A message to deliver, written in the transaction of the business change.

    Delivery is at least once (tools_app.outbox); `id` is the stable event id
    every consumer dedupes by, so the effect happens once.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey("tools_app.Tenant", on_delete=models.PROTECT, related_name="outbox_events")
    record = models.ForeignKey("tools_app.IdempotencyRecord", on_delete=models.PROTECT, null=True, blank=True,
                               related_name="outbox_events")
    operation_id = models.UUIDField(null=True, blank=True, editable=False,
                                    help_text="The operation_id of the record that wrote it, if any; sent along.")
    kind = models.CharField(max_length=64, help_text="What the relay does with it, e.g. notification.email")
    payload = PersonalJSONField(help_text="What is delivered (personal values encrypted: core.personal).")
    status = models.CharField(max_length=16, choices=OutboxStatus.choices, default=OutboxStatus.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField()
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField()
    trace_id = models.CharField(max_length=100, blank=True, help_text="The trace of the call that wrote it.")
    span_id = models.CharField(max_length=16, blank=True, help_text="Its span: deliveries are traced under it.")
    delivered_at = models.DateTimeField(null=True, blank=True)
    # A relay's claim on a pending event while it delivers it (outbox.relay): no row lock is held meanwhile.
    claimed_by = models.CharField(max_length=100, blank=True, default="")
    claimed_until = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["next_attempt_at"], condition=models.Q(status="pending"), name="outbox_due"),
            models.Index(fields=["status", "created_at"], name="outbox_status_created"),
            # the console's filters (tools_app/admin/big_lists.py), each with the tenant scoping
            models.Index(fields=["tenant", "status", "created_at"], name="outbox_tenant_status"),
            models.Index(fields=["tenant", "kind", "created_at"], name="outbox_tenant_kind"),
            models.Index(fields=["tenant", "created_at"], name="outbox_tenant_created"),
            models.Index(fields=["tenant", "delivered_at"], name="outbox_tenant_delivered"),
        ]
        permissions = [("redrive_outboxevent", "Can re-drive dead-lettered outbox events")]

    def __str__(self) -> str:
        return f"{self.kind} {self.id} ({self.status})"


class DeadLetter(OutboxEvent):
    """The operators' queue of dead-lettered outbox events."""

    class Meta:
        proxy = True
        verbose_name = "dead-lettered event"
        ordering = ["created_at"]


class NotificationChannel(models.Model):
    """A tenant's channel for approvers' notices and escalations beyond email: an Apprise URL (Slack,
    Microsoft Teams, PagerDuty, a JSON endpoint, ...; tools_app.outbox.channels). The URL holds the
    channel's secret (a webhook token, an integration key), so it is stored sealed like a webhook
    signing secret; the console shows only its scheme and host (`shown`)."""

    tenant = models.ForeignKey("tools_app.Tenant", on_delete=models.CASCADE, related_name="notification_channels")
    name = models.CharField(max_length=100, help_text="What the operators call it, e.g. “#payments-approvals”.")
    sealed_url = models.TextField(editable=False)
    shown = models.CharField(max_length=200, editable=False, help_text="Its scheme and host; the rest is secret.")
    escalations_only = models.BooleanField(
        default=False, help_text="Told only when a request is escalated (e.g. a PagerDuty service), "
                                 "not of every new request.")
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "name"], name="channel_name_per_tenant")]
        # One permission for adding and changing (outbox.channels.CHANGE_CHANNEL), as retention's manage_retention.
        permissions = [("manage_notificationchannel", "Can add and change a tenant's notification channels")]

    def __str__(self) -> str:
        return f"{self.name} ({self.shown})"
