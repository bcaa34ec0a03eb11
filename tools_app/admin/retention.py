"""Per-tenant retention overrides and audit retention: every change goes through tools_app.retention, which
checks the permission and the tenant and audits the change (with the periods or days before and after)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from tools_app import retention
from tools_app.admin.generic import ModelAdmin
from tools_app.admin.refusals import RefusalsAuditedAdmin
from tools_app.admin.scoping import TenantScopedAdmin
from tools_app.core.errors import PermissionDenied, Refused
from tools_app.retention.models import AuditRetention, RetentionOverride

if TYPE_CHECKING:
    _OverrideForm = forms.ModelForm[RetentionOverride]
else:
    _OverrideForm = forms.ModelForm  # django's ModelForm is generic only to the type checker


class _AppKindsForm(_OverrideForm):
    """An override's periods of the apps' own kinds, as fields of their own, read from and kept in app_kinds."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for kind in retention.APP_KINDS:
            self.initial.setdefault(kind, self.instance.period(kind))

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        for kind in retention.APP_KINDS:
            self.instance.set_period(kind, cleaned.get(kind))
        return cleaned


OVERRIDE_FIELDS = ("tenant", "tool", "records", "tasks", "artifacts")


@admin.register(RetentionOverride)
class RetentionOverrideAdmin(RefusalsAuditedAdmin[RetentionOverride], TenantScopedAdmin[RetentionOverride],
                             ModelAdmin[RetentionOverride]):
    refusal_permit = retention.CHANGE_RETENTION
    list_display = ["tenant", "tool_display", "records", "tasks", "artifacts", "app_kinds_display", "updated_at"]
    list_filter = [("tenant", admin.RelatedOnlyFieldListFilter), "tool"]
    list_select_related = ["tenant"]
    fields = OVERRIDE_FIELDS

    # The installed apps' own kinds (retention.register_retained): a period field each, kept in app_kinds.
    def get_fields(self, request: HttpRequest, obj: RetentionOverride | None = None) -> tuple[str, ...]:
        return (*OVERRIDE_FIELDS, *retention.APP_KINDS)

    def get_form(self, request: HttpRequest, obj: RetentionOverride | None = None, change: bool = False,
                 **kwargs: Any) -> type[forms.ModelForm[RetentionOverride]]:
        kinds = {kind: forms.DurationField(required=False, help_text=spec.description)
                 for kind, spec in retention.APP_KINDS.items()}
        base = type("RetentionOverrideForm", (_AppKindsForm,), kinds)
        kwargs["fields"] = list(OVERRIDE_FIELDS)
        form: type[forms.ModelForm[RetentionOverride]] = super().get_form(request, obj, change, form=base, **kwargs)
        return form

    @admin.display(description="apps' kinds")
    def app_kinds_display(self, obj: RetentionOverride) -> str:
        return ", ".join(f"{kind}: {obj.period(kind)}" for kind in obj.app_kinds) or "-"

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


@admin.register(AuditRetention)
class AuditRetentionAdmin(RefusalsAuditedAdmin[AuditRetention], TenantScopedAdmin[AuditRetention],
                          ModelAdmin[AuditRetention]):
    """How long each tenant's audit events are kept; set through retention.set_audit_retention only. No delete:
    a tenant's policy is changed (0 days: for ever), never removed behind the audit log's back."""

    refusal_permit = retention.CHANGE_RETENTION
    list_display = ["tenant", "keep_days", "updated_at"]
    list_select_related = ["tenant"]
    fields = ["tenant", "keep_days"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(retention.CHANGE_RETENTION.permission)

    def has_change_permission(self, request: HttpRequest, obj: AuditRetention | None = None) -> bool:
        return request.user.has_perm(retention.CHANGE_RETENTION.permission)

    def has_delete_permission(self, request: HttpRequest, obj: AuditRetention | None = None) -> bool:
        return False

    def get_readonly_fields(self, request: HttpRequest, obj: AuditRetention | None = None) -> tuple[str, ...]:
        return ("tenant",) if obj is not None else ()  # a policy is its tenant's: another tenant's is added

    def save_model(self, request: HttpRequest, obj: AuditRetention, form: Any, change: bool) -> None:
        try:
            saved = retention.set_audit_retention(request.user, obj.tenant, obj.keep_days)
        except PermissionDenied as exc:
            raise Refused(exc.message, obj) from None
        obj.pk, obj.updated_at = saved.pk, saved.updated_at  # the admin's log entry and redirect name the row
