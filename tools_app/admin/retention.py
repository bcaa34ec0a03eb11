"""Per-tenant retention overrides: every change goes through tools_app.retention, which checks the
permission and the tenant and audits the change (with the periods before and after)."""

from __future__ import annotations

from typing import Any, NoReturn

from django.contrib import admin
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse

from tools_app import access, retention
from tools_app.admin.generic import ModelAdmin
from tools_app.admin.scoping import TenantScopedAdmin
from tools_app.core import audit
from tools_app.core.errors import PermissionDenied, Refused
from tools_app.retention.models import RetentionOverride


@admin.register(RetentionOverride)
class RetentionOverrideAdmin(TenantScopedAdmin[RetentionOverride], ModelAdmin[RetentionOverride]):
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

    # Django runs these views in a transaction, which a refusal rolls back, its audit event included:
    # the refusal is written again once that transaction is gone, then answered 403.
    def changeform_view(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        try:
            return super().changeform_view(request, *args, **kwargs)
        except Refused as refused:
            self._refuse(request, refused)

    def delete_view(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        try:
            return super().delete_view(request, *args, **kwargs)
        except Refused as refused:
            self._refuse(request, refused)

    def changelist_view(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        try:
            return super().changelist_view(request, *args, **kwargs)
        except Refused as refused:
            self._refuse(request, refused)

    def _refuse(self, request: HttpRequest, refused: Refused) -> NoReturn:
        access.audit_refusal(retention.CHANGE_RETENTION, refused.subject or self.model, audit.user_actor(request.user),
                             refused.reason)
        raise DjangoPermissionDenied(refused.reason)
