"""Human approval of sensitive operations: requests, decisions, per-tenant settings.

An ApprovalRequest is bound to ONE idempotency record (one-to-one) and the
fingerprint it was claimed with; every change of its status is a conditional
UPDATE in tools_app.approvals.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import F, Q

from tools_app.conf import conf
from tools_app.core import url_allowlist
from tools_app.core.errors import ToolFailure
from tools_app.core.personal import PersonalJSONField

if TYPE_CHECKING:
    from tools_app.access.models import Tenant


class ApprovalStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    APPROVED = "approved", "Approved (executing)"
    EXECUTED = "executed", "Executed"
    FAILED = "failed", "Failed after approval"
    REJECTED = "rejected", "Rejected"
    EXPIRED = "expired", "Expired"


class ApprovalRequest(models.Model):
    tenant = models.ForeignKey("tools_app.Tenant", on_delete=models.PROTECT, related_name="approval_requests")
    record = models.OneToOneField("tools_app.IdempotencyRecord", on_delete=models.PROTECT, related_name="approval")
    operation_id = models.UUIDField(null=True, blank=True, editable=False, help_text="Its record's operation_id.")
    fingerprint = models.CharField(max_length=64, help_text="The record's fingerprint when approval was asked.")
    tool = models.CharField(max_length=100)
    arguments = PersonalJSONField(help_text="The validated call arguments, re-validated when the approved call runs "
                                  "(personal values encrypted: core.personal).")
    summary = models.TextField(help_text="What the operator is asked to approve, as shown in the queue.")
    amount = models.DecimalField(max_digits=14, decimal_places=2, null=True, blank=True)
    currency = models.CharField(max_length=3, blank=True)
    requested_by = models.CharField(max_length=200, help_text="The caller's identity; it can never approve.")
    requester_owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, blank=True, related_name="+",
        help_text="The owner of the agent token that asked, when it asked: they cannot approve it (four eyes).")
    trace_id = models.CharField(max_length=100, blank=True)
    required_approvals = models.PositiveSmallIntegerField(default=1)
    approvals = models.PositiveSmallIntegerField(default=0, help_text="Distinct approvers so far.")
    status = models.CharField(max_length=16, choices=ApprovalStatus.choices, default=ApprovalStatus.PENDING)
    reason = models.TextField(blank=True, help_text="Why it was rejected (required), or what ended it.")
    decided_by = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    decided_at = models.DateTimeField(null=True, blank=True)
    dispatched_at = models.DateTimeField(null=True, blank=True, help_text="Last time its execution job was queued.")
    escalated_at = models.DateTimeField(
        null=True, blank=True, help_text="When it was still waiting past the tenant's escalation time and the "
                                         "approvers were told again.")
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        permissions = [("decide_approvalrequest", "Can approve or reject sensitive operations")]
        constraints = [
            models.CheckConstraint(condition=Q(required_approvals__gte=1), name="approval_needs_an_approver"),
            models.CheckConstraint(condition=Q(approvals__lte=F("required_approvals")),
                                   name="approvals_at_most_required"),
        ]
        indexes = [
            models.Index(fields=["status", "expires_at"], name="approval_status_expiry"),
            models.Index(fields=["tenant", "status", "created_at"], name="approval_tenant_queue"),
            # the console's filters (tools_app/admin/big_lists.py), each with the tenant scoping
            models.Index(fields=["tenant", "created_at"], name="approval_tenant_created"),
            models.Index(fields=["tenant", "tool", "created_at"], name="approval_tenant_tool"),
            models.Index(fields=["tenant", "finished_at"], name="approval_tenant_finished"),
            models.Index(fields=["tenant", "requested_by", "created_at"], name="approval_tenant_asker"),
            models.Index(fields=["trace_id"], condition=~Q(trace_id=""), name="approval_trace"),
        ]

    def __str__(self) -> str:
        return f"Approval #{self.pk} {self.tool} ({self.status})"


class ApprovalQueue(ApprovalRequest):
    """The operators' queue: pending requests only (see tools_app.admin.approvals)."""

    class Meta:
        proxy = True
        verbose_name = "pending approval"
        verbose_name_plural = "pending approvals"


class ApprovalVerdict(models.TextChoices):
    APPROVE = "approve"
    REJECT = "reject"


class ApprovalDecision(models.Model):
    """One person's decision on a request. Unique per (request, user): N approvals need N people."""

    request = models.ForeignKey(ApprovalRequest, on_delete=models.PROTECT, related_name="decisions")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="approval_decisions")
    verdict = models.CharField(max_length=8, choices=ApprovalVerdict.choices)
    reason = models.TextField(blank=True)
    created_at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["request", "user"], name="one_decision_per_person")]

    def __str__(self) -> str:
        return f"{self.user} {self.verdict}d #{self.request_id}"


class ApprovalSettings(models.Model):
    """Per-tenant approval thresholds. A tenant without a row uses the defaults below."""

    tenant = models.OneToOneField("tools_app.Tenant", on_delete=models.CASCADE, related_name="approval_settings")
    request_ttl_minutes = models.PositiveIntegerField(
        default=24 * 60, help_text="How long a request waits for a decision before it expires.")
    payment_threshold = models.DecimalField(
        max_digits=14, decimal_places=2, null=True, blank=True,
        help_text="Payments above this amount need one approval. Empty: payments never need approval.")
    payment_second_threshold = models.DecimalField(
        max_digits=14, decimal_places=2, null=True, blank=True,
        help_text="Payments above this amount need two different approvers.")
    step_up_amount = models.DecimalField(
        max_digits=14, decimal_places=2, null=True, blank=True,
        help_text="Approving a payment above this amount needs a second-factor code entered within "
                  "IDEMOPS_STEP_UP_MINUTES (asked again when older). Empty: the session's code suffices.")
    threshold_currency = models.CharField(
        max_length=3, default="EUR", help_text="Currency of the thresholds; other currencies always need approval.")
    escalate_after_minutes = models.PositiveIntegerField(
        default=60, help_text="A request still waiting this long is escalated: the approvers (and the escalation "
                              "address) are told again and it stands out in the queue. 0: never.")
    notify_webhook_url = models.URLField(
        blank=True, help_text="Optional: also POST each new and each escalated request here (JSON). It must fall "
                              "under IDEMOPS_WEBHOOK_ALLOWED_PREFIXES.")
    escalation_email = models.EmailField(
        blank=True, help_text="Optional: who else is told when a request is escalated (e.g. a team lead).")

    class Meta:
        verbose_name_plural = "approval settings"

    def __str__(self) -> str:
        return f"approval settings of {self.tenant}"

    def clean(self) -> None:
        # Checked here (the admin's form runs it) and again by the relay before each delivery.
        if self.notify_webhook_url:
            try:
                url_allowlist.check(self.notify_webhook_url, conf().webhook_allowed_prefixes,
                                    field="notify_webhook_url")
            except ToolFailure as refused:
                raise ValidationError({"notify_webhook_url": refused.message}) from None

    @classmethod
    def of(cls, tenant: Tenant) -> ApprovalSettings:
        """The tenant's settings, or the defaults if it has none."""
        try:
            settings_: ApprovalSettings = tenant.approval_settings  # the reverse one-to-one
            return settings_
        except cls.DoesNotExist:
            return cls(tenant=tenant)


class ApprovalLink(models.Model):
    """One approver's link to one request, as sent in one message (tools_app.approvals.links).

    The URL carries a token signed with Django's signing (request, person, deadline, a random nonce);
    the row keeps only its SHA-256 digest, and `used_at` is set once, by a guarded UPDATE, in the
    transaction of the decision the link made: a link decides at most once.
    """

    request = models.ForeignKey(ApprovalRequest, on_delete=models.CASCADE, related_name="links")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    digest = models.CharField(max_length=64, unique=True, help_text="SHA-256 of the token in the link.")
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    used_at = models.DateTimeField(null=True, blank=True)
    used_for = models.CharField(max_length=8, blank=True, choices=ApprovalVerdict.choices)

    def __str__(self) -> str:
        return f"link to #{self.request_id} for user {self.user_id}"
