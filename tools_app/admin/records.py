"""Idempotency records, read-only: fingerprint, stored result, attempts, history; force-expire and
release a held key (audited)."""

from django import forms
from django.contrib import admin
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html

from tools_app import access, reconciliation
from tools_app.admin import story as stories
from tools_app.admin.big_lists import DateRangeFilter, RecentValuesFilter, TenantFilter
from tools_app.admin.operator_actions import (
    REASON_REQUIRED,
    OperatorAction,
    OperatorActionsAdmin,
    pretty_json,
)
from tools_app.admin.scoping import ListedFromReplica, ReadOnlyAdmin, TenantScopedAdmin
from tools_app.approvals.models import ApprovalRequest
from tools_app.core import keys
from tools_app.core.errors import Refused, ToolFailure
from tools_app.engine.models import IdempotencyRecord


def force_expire(request: HttpRequest, record: IdempotencyRecord, reason: str) -> str:
    if not reconciliation.force_expire(record, request.user, reason=reason):
        raise Refused("only a finished record within its retention can be expired")
    return "retention ended now; the tool's expiry policy applies to the next call with this key"


def release_held_key(request: HttpRequest, record: IdempotencyRecord, reason: str, checked: str,
                     downstream_reference: str = "") -> str:
    if not reconciliation.release_held_key(record, request.user, reason=reason, checked=checked,
                                        downstream_reference=downstream_reference):
        raise Refused("only a finished record past its retention (a held key) can be released")
    return "released; the next call with this key runs as a new operation"


@admin.register(IdempotencyRecord)
class IdempotencyRecordAdmin(ListedFromReplica[IdempotencyRecord], OperatorActionsAdmin[IdempotencyRecord],
                             TenantScopedAdmin[IdempotencyRecord],
                             ReadOnlyAdmin[IdempotencyRecord]):
    list_display = ["id", "tenant", "tool", "key_digest", "status", "attempts", "created_at", "expires_at"]
    list_filter = ["status", "error_class", ("tool", RecentValuesFilter), ("tenant", TenantFilter),
                   ("created_at", DateRangeFilter), ("finished_at", DateRangeFilter)]
    search_fields = ["=operation_id", "=trace_id"]
    list_select_related = ["tenant"]
    list_deferred = ("field_digests", "arguments", "result", "error_message", "evidence")
    fields = readonly_fields = (
        "tenant", "tool", "key_digest", "status", "fingerprint", "field_digests_display", "arguments_display",
        "result_display", "error_class", "error_message", "retry_not_before", "attempts", "lease_owner",
        "lease_expires_at", "operation_id", "downstream_key", "trace_id", "actor", "created_at", "updated_at",
        "finished_at", "expires_at", "retired_at", "evidence_display", "approval_link", "story",
    )
    operator_actions = [
        OperatorAction("force_expire", "Force-expire key", reconciliation.FORCE_EXPIRE, force_expire,
                       refused=(Refused, ToolFailure), reason=REASON_REQUIRED, style="danger",
                       help_text="Required: why this key's stored result must no longer be replayed."),
        OperatorAction("release_held_key", "Release held key", reconciliation.RELEASE_HELD_KEY, release_held_key,
                       refused=(Refused, ToolFailure), reason=REASON_REQUIRED, style="danger",
                       help_text="Required: why the key may run again. Check the downstream system first: "
                                 "the next call with this key runs as a new operation.",
                       extra_fields={
                           "checked": forms.CharField(
                               widget=forms.Textarea(attrs={"rows": 2, "cols": 60}), label="What you checked",
                               help_text="Where you looked and what it showed, e.g. 'gateway: no payment for "
                                         "this key' or 'gateway: payment pay_123 refunded'."),
                           "downstream_reference": forms.CharField(
                               required=False, help_text="The downstream id you found, if any."),
                       }),
    ]

    def get_ordering(self, request: HttpRequest) -> tuple[str, ...]:
        """Newest first, in an order PostgreSQL reads from an index and stops after one page: by the tenant's
        creation times (`record_tenant_created`) when the list shows one tenant, by the primary key (in
        creation order too) when it shows all of them, which no (tenant, created_at) index can order."""
        visible = access.visible_tenant_ids(request.user)
        one_tenant = (visible is not None and len(visible) == 1) or "tenant__id__exact" in request.GET
        return ("-created_at",) if one_tenant else ("-pk",)

    @admin.display(description="key (digest)")
    def key_digest(self, obj: IdempotencyRecord) -> str:
        # Keys may carry the caller's data; operators match them by digest, as in the logs.
        return keys.key_digest(obj.key)

    @admin.display(description="field digests")
    def field_digests_display(self, obj: IdempotencyRecord) -> str:
        return pretty_json(obj.field_digests)

    @admin.display(description="arguments")
    def arguments_display(self, obj: IdempotencyRecord) -> str:
        return pretty_json(obj.arguments)

    @admin.display(description="stored result")
    def result_display(self, obj: IdempotencyRecord) -> str:
        return pretty_json(obj.result) if obj.result is not None else "—"

    @admin.display(description="evidence")
    def evidence_display(self, obj: IdempotencyRecord) -> str:
        # What was asked downstream and what came back; an operator's release or resolution adds what they checked.
        return pretty_json(obj.evidence) if obj.evidence else "—"

    @admin.display(description="approval request")
    def approval_link(self, obj: IdempotencyRecord) -> str:
        request = ApprovalRequest.objects.filter(record=obj).first()
        if request is None:
            return "—"
        url = reverse("admin:tools_app_approvalrequest_change", args=[request.pk])
        return format_html('<a href="{}">#{} ({})</a>', url, request.pk, request.status)

    @admin.display(description="story")
    def story(self, obj: IdempotencyRecord) -> str:
        # Its parts (approval, task, outbox events, what it created, the key's other operations) and
        # everything that happened to them, evidence included, in order.
        return stories.render(obj)
