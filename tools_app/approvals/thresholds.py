"""A tenant's approval settings: the thresholds that decide which calls wait for a person.

A threshold decides what runs without anyone looking, so changing one is an
operator operation like a decision: behind its Permit (the permission to
change approval settings, on the tenant), refusals audited, and the change
audited in the transaction that saves it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.db import transaction

from tools_app import access
from tools_app.approvals.models import ApprovalRequest, ApprovalSettings
from tools_app.core import audit

if TYPE_CHECKING:
    from django.contrib.auth.models import AnonymousUser, User

CHANGE_SETTINGS = access.Permit("tools_app.change_approvalsettings", "change_settings",
                                "change approval settings", "approval_settings.change_refused")
AUDITED = ("request_ttl_minutes", "payment_threshold", "payment_second_threshold", "step_up_amount",
           "threshold_currency",
           "escalate_after_minutes", "notify_webhook_url", "escalation_email")


def save_settings(row: ApprovalSettings, user: User | AnonymousUser, *,
                  before: dict[str, str] | None) -> ApprovalSettings:
    """Save `row` (new or changed) for `user`, who needs CHANGE_SETTINGS on its tenant; `before` is what
    the audited fields held (None for a new row)."""
    actor = access.authorize(user, CHANGE_SETTINGS, row)
    with transaction.atomic():
        row.save()
        audit.record_event(action="approval_settings.changed", obj=row, actor=actor, before=before,
                           after={name: str(getattr(row, name)) for name in AUDITED})
    return row


def needs_step_up(request: ApprovalRequest) -> bool:
    """Whether approving `request` needs a recent second-factor code: an amount above its tenant's step-up
    amount (an amount in another currency than the thresholds' cannot be compared, so it needs one too)."""
    row = ApprovalSettings.objects.filter(tenant_id=request.tenant_id).first()
    if row is None or row.step_up_amount is None or request.amount is None:
        return False
    return request.currency != row.threshold_currency or request.amount > row.step_up_amount
