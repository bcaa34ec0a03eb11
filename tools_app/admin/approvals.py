"""Approvals in the admin: the pending queue (approve / reject), every request's history, settings."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.auth.models import User
from django.db import models
from django.db.models import Q
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from tools_app import approvals
from tools_app.admin import story as stories
from tools_app.admin.big_lists import DateRangeFilter, RecentValuesFilter, TenantFilter
from tools_app.admin.generic import ModelAdmin
from tools_app.admin.operator_actions import (
    REASON_REQUIRED,
    OperatorAction,
    QueueAdmin,
    age,
    pretty_json,
    time_left,
)
from tools_app.admin.refusals import RefusalsAuditedAdmin
from tools_app.admin.scoping import ListedFromReplica, ReadOnlyAdmin, TenantScopedAdmin
from tools_app.approvals import thresholds
from tools_app.approvals.models import (
    ApprovalDecision,
    ApprovalQueue,
    ApprovalRequest,
    ApprovalSettings,
    ApprovalStatus,
)
from tools_app.core import errors


def _approver(request: HttpRequest) -> User:
    # The admin site lets only a signed-in staff user reach an action, so this is never anonymous.
    assert isinstance(request.user, User)
    return request.user


def approve(request: HttpRequest, obj: ApprovalQueue, reason: str) -> str:
    decided = approvals.approve(obj, _approver(request), reason=reason)
    if decided.status == ApprovalStatus.APPROVED:
        return "approved; it is being executed"
    return f"approval counted ({decided.approvals} of {decided.required_approvals})"


def reject(request: HttpRequest, obj: ApprovalQueue, reason: str) -> str:
    approvals.reject(obj, _approver(request), reason=reason)
    return "rejected; it will not run"


class ApprovalColumns:
    """Columns and detail fields shared by the queue and the history."""

    @admin.display(description="amount", ordering="amount")
    def amount_display(self, obj: ApprovalRequest) -> str:
        return f"{obj.amount:.2f} {obj.currency}" if obj.amount is not None else "—"

    @admin.display(description="who asked", ordering="requested_by")
    def who_asked(self, obj: ApprovalRequest) -> str:
        # The owner is the person behind the agent: four eyes means they never approve it.
        owner = obj.requester_owner.get_username() if obj.requester_owner is not None else None
        return f"{obj.requested_by} (owner: {owner})" if owner else obj.requested_by

    @admin.display(description="age", ordering="created_at")
    def age_display(self, obj: ApprovalRequest) -> str:
        return age(obj.created_at)

    @admin.display(description="expires", ordering="expires_at")
    def expires_display(self, obj: ApprovalRequest) -> str:
        return time_left(obj.expires_at)

    @admin.display(description="approvals")
    def approvals_display(self, obj: ApprovalRequest) -> str:
        return f"{obj.approvals} of {obj.required_approvals}"

    @admin.display(description="arguments")
    def arguments_display(self, obj: ApprovalRequest) -> str:
        return pretty_json(obj.arguments)

    @admin.display(description="idempotency record")
    def record_link(self, obj: ApprovalRequest) -> SafeString:
        url = reverse("admin:tools_app_idempotencyrecord_change", args=[obj.record_id])
        return format_html('<a href="{}">#{} ({})</a>', url, obj.record_id, obj.record.status)

    @admin.display(description="decisions")
    def decisions_display(self, obj: ApprovalRequest) -> str:
        decisions = obj.decisions.select_related("user").order_by("created_at")
        return format_html_join(
            "", "<div>{} {} {}s {}</div>",
            ((f"{d.created_at:%Y-%m-%d %H:%M:%S}", d.user.get_username(), d.verdict, d.reason) for d in decisions),
        ) or "—"

    @admin.display(description="story")
    def story(self, obj: ApprovalRequest) -> str:
        return stories.render(obj)


# A tuple: both `fields` and `readonly_fields` take it (the stubs type them differently, and a list is invariant).
DETAIL_FIELDS = ("summary", "tool", "tenant", "amount_display", "who_asked", "status", "approvals_display",
                 "created_at", "expires_at", "escalated_at", "decided_at", "decided_by", "reason", "arguments_display",
                 "record_link", "trace_id", "decisions_display", "story")


@admin.register(ApprovalQueue)
class ApprovalQueueAdmin(ApprovalColumns, QueueAdmin[ApprovalQueue]):
    queue_filter = {"status": ApprovalStatus.PENDING}
    stands_out_label = "escalated"
    what_to_do = ("Sensitive operations agents asked for; nothing has run yet. Open one, read what it would do "
                  "(summary, amount, arguments, its record), then Approve or Reject (a rejection needs a reason: the "
                  "agent is told). Some need two different approvers; the owner of the agent that asked cannot "
                  "approve it. A request still waiting after its tenant's escalation time is marked escalated and "
                  "its approvers are told again.")
    list_display = ["id", "flag", "summary", "tenant", "tool", "amount_display", "who_asked", "age_display",
                    "expires_display", "approvals_display"]
    list_display_links = ["id", "summary"]
    list_filter = ["tool", ("tenant", admin.RelatedOnlyFieldListFilter), "required_approvals",
                   ("escalated_at", admin.EmptyFieldListFilter)]
    search_fields = ["summary", "requested_by", "tool", "=trace_id"]
    list_select_related = ["tenant", "requester_owner"]
    fields = DETAIL_FIELDS
    readonly_fields = DETAIL_FIELDS
    operator_actions = [
        OperatorAction("approve", "Approve", approvals.APPROVE, approve, refused=(errors.Refused,),
                       help_text="Optional note for the audit log."),
        OperatorAction("reject", "Reject", approvals.REJECT, reject, refused=(errors.Refused,),
                       reason=REASON_REQUIRED, help_text="Required: the agent and the audit log get it.",
                       style="danger"),
    ]

    def standing_out(self) -> Q:
        return Q(escalated_at__isnull=False)

    def render_change_form(self, request: HttpRequest, context: dict[str, Any], add: bool = False, change: bool = False,
                           form_url: str = "", obj: ApprovalQueue | None = None) -> HttpResponse:
        if obj is not None and obj.requester_owner_id == request.user.pk:
            context["notice"] = (f"Four eyes: you own the agent that asked ({obj.requested_by}). You may reject it; "
                                 "another approver must approve it.")
        return super().render_change_form(request, context, add=add, change=change, form_url=form_url, obj=obj)


@admin.register(ApprovalRequest)
class ApprovalRequestAdmin(ApprovalColumns, ListedFromReplica[ApprovalRequest], TenantScopedAdmin[ApprovalRequest],
                           ReadOnlyAdmin[ApprovalRequest]):
    list_display = ["id", "summary", "tenant", "tool", "status", "amount_display", "who_asked", "created_at",
                    "decided_by", "approvals_display"]
    list_filter = ["status", ("tool", RecentValuesFilter), ("tenant", TenantFilter), ("created_at", DateRangeFilter),
                   ("finished_at", DateRangeFilter)]
    search_fields = ["requested_by", "trace_id"]
    list_select_related = ["tenant", "requester_owner"]
    fields = DETAIL_FIELDS
    readonly_fields = DETAIL_FIELDS


@admin.register(ApprovalDecision)
class ApprovalDecisionAdmin(ListedFromReplica[ApprovalDecision], TenantScopedAdmin[ApprovalDecision],
                            ReadOnlyAdmin[ApprovalDecision]):
    tenant_field = "request__tenant_id"
    list_display = ["created_at", "request", "user", "verdict", "reason"]
    list_filter = ["verdict"]


@admin.register(ApprovalSettings)
class ApprovalSettingsAdmin(RefusalsAuditedAdmin[ApprovalSettings], TenantScopedAdmin[ApprovalSettings],
                            ModelAdmin[ApprovalSettings]):
    refusal_permit = thresholds.CHANGE_SETTINGS
    list_display = ["tenant", "request_ttl_minutes", "payment_threshold", "payment_second_threshold",
                    "threshold_currency", "escalate_after_minutes", "notify_webhook_url", "escalation_email"]
    formfield_overrides = {models.URLField: {"assume_scheme": "https"}}

    def save_model(self, request: HttpRequest, obj: ApprovalSettings, form: Any, change: bool) -> None:
        before = {name: str(form.initial.get(name)) for name in thresholds.AUDITED} if change else None
        try:
            thresholds.save_settings(obj, request.user, before=before)
        except errors.PermissionDenied as refused:  # audited again after the rollback (RefusalsAuditedAdmin)
            raise errors.Refused(refused.message, obj) from None
