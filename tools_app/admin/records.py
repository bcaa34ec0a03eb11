"""Idempotency records, read-only: fingerprint, stored result, attempts, history; force-expire (audited)."""

from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html

from tools_app import audit, idempotency
from tools_app.admin.operator_actions import (
    REASON_REQUIRED,
    OperatorAction,
    OperatorActionsAdmin,
    audit_history,
    pretty_json,
)
from tools_app.admin.scoping import ReadOnlyAdmin, TenantScopedAdmin
from tools_app.models import ApprovalRequest, IdempotencyRecord


class NotExpirable(Exception):
    pass


def force_expire(request, record, reason: str) -> str:
    if not idempotency.force_expire(record, actor=audit.user_actor(request.user), reason=reason):
        raise NotExpirable("only a finished record within its retention can be expired")
    return "retention ended now; the tool's expiry policy applies to the next call with this key"


@admin.register(IdempotencyRecord)
class IdempotencyRecordAdmin(OperatorActionsAdmin, TenantScopedAdmin, ReadOnlyAdmin):
    list_display = ["id", "tenant", "tool", "key_digest", "status", "attempts", "created_at", "expires_at"]
    list_filter = ["status", "error_class", "tool", ("tenant", admin.RelatedOnlyFieldListFilter)]
    search_fields = ["=operation_id", "=trace_id"]
    date_hierarchy = "created_at"
    list_select_related = ["tenant"]
    fields = ["tenant", "tool", "key_digest", "status", "fingerprint", "field_digests_display", "arguments_display",
              "result_display", "error_class", "error_message", "retry_not_before", "attempts", "lease_owner",
              "lease_expires_at", "operation_id", "trace_id", "actor", "created_at", "updated_at", "finished_at",
              "expires_at", "retired_at", "approval_link", "history"]
    readonly_fields = fields
    operator_actions = [
        OperatorAction("force_expire", "Force-expire key", "force_expire", force_expire, refused=(NotExpirable,),
                       reason=REASON_REQUIRED, style="danger",
                       help_text="Required: why this key's stored result must no longer be replayed."),
    ]

    def has_force_expire_permission(self, request, obj=None):
        return request.user.has_perm("tools_app.force_expire_idempotencyrecord")

    @admin.display(description="key (digest)")
    def key_digest(self, obj):
        # Keys may carry the caller's data; operators match them by digest, as in the logs.
        return idempotency.key_digest(obj.key)

    @admin.display(description="field digests")
    def field_digests_display(self, obj):
        return pretty_json(obj.field_digests)

    @admin.display(description="arguments")
    def arguments_display(self, obj):
        return pretty_json(obj.arguments)

    @admin.display(description="stored result")
    def result_display(self, obj):
        return pretty_json(obj.result) if obj.result is not None else "—"

    @admin.display(description="approval request")
    def approval_link(self, obj):
        request = ApprovalRequest.objects.filter(record=obj).first()
        if request is None:
            return "—"
        url = reverse("admin:tools_app_approvalrequest_change", args=[request.pk])
        return format_html('<a href="{}">#{} ({})</a>', url, request.pk, request.status)

    @admin.display(description="audit history")
    def history(self, obj):
        return audit_history(obj, ApprovalRequest.objects.filter(record=obj).first())
