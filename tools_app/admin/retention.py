"""Per-tenant retention overrides: every change goes through tools_app.retention, which checks the
permission and the tenant and audits the change (with the periods before and after)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from tools_app import retention
from tools_app.admin.generic import ModelAdmin
from tools_app.admin.refusals import RefusalsAuditedAdmin
from tools_app.admin.scoping import TenantScopedAdmin
from tools_app.core.errors import PermissionDenied, Refused
from tools_app.retention.models import RetentionOverride


@admin.register(RetentionOverride)
class RetentionOverrideAdmin(RefusalsAuditedAdmin[RetentionOverride], TenantScopedAdmin[RetentionOverride],
                             ModelAdmin[RetentionOverride]):
    refusal_permit = retention.CHANGE_RETENTION
    list_display = ["tenant", "tool_display", "records", "tasks", "artifacts", "documents", "updated_at"]
    list_filter = [("tenant", admin.RelatedOnlyFieldListFilter), "tool"]
    list_select_related = ["tenant"]
    fields = ["tenant", "tool", "records", "tasks", "artifacts", "documents"]

    # One permission (manage_retention) for every change; the concept functions check it again, with the tenant.
    def has_add_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(retention.CHANGE_RETENTION.permission)

    def has_change_permission(self, request: HttpRequest, obj: RetentionOverride | None = None) -> bool:
        return request.user.has_perm(retention.CHANGE_RETENTION.permission)

    def has_delete_permission(self, request: HttpRequest, obj: RetentionOverride | None = None) -> bool:
        return request.user.has_perm(retention.CHANGE_RETENTION.permission)

    @admin.display(description="tool", ordering="tool")
    def tool_display(self, obj: RetentionOverride) -> str:
        return obj.tool or "(every tool)"

    def save_model(self, request: HttpRequest, obj: RetentionOverride, form: Any, change: bool) -> None:
        before = RetentionOverride.objects.filter(pk=obj.pk).first() if change else None
        try:
            retention.save_override(request.user, obj, before)
        except PermissionDenied as exc:
            raise Refused(exc.message, obj) from None

    def delete_model(self, request: HttpRequest, obj: RetentionOverride) -> None:
        try:
            retention.delete_override(request.user, obj)
        except PermissionDenied as exc:
            raise Refused(exc.message, obj) from None

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[RetentionOverride]) -> None:
        for obj in queryset:
            self.delete_model(request, obj)
