"""Per-tenant limits in the admin: calls per minute (the tenant's, each token's) and unfinished
tasks per agent. Saving goes through access.change_limits, which checks the permission and the
tenant and audits the change (before and after), whoever calls it."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import ForeignKey
from django.forms import ModelChoiceField
from django.http import HttpRequest

from tools_app import access
from tools_app.access.limits import LIMIT_FIELDS
from tools_app.access.models import Tenant, TenantLimits
from tools_app.admin.refusals import RefusalsAuditedAdmin
from tools_app.admin.scoping import TenantScopedAdmin
from tools_app.core.errors import PermissionDenied, Refused


@admin.register(TenantLimits)
class TenantLimitsAdmin(RefusalsAuditedAdmin[TenantLimits], TenantScopedAdmin[TenantLimits]):
    refusal_permit = access.CHANGE_LIMITS
    list_display = ["tenant", *LIMIT_FIELDS]
    list_select_related = ["tenant"]
    fields = ["tenant", *LIMIT_FIELDS]

    def get_readonly_fields(self, request: HttpRequest, obj: TenantLimits | None = None) -> list[str]:
        return ["tenant"] if obj is not None else []

    def formfield_for_foreignkey(self, db_field: ForeignKey[Any, Any], request: HttpRequest,
                                 **kwargs: Any) -> ModelChoiceField[Any] | None:
        if db_field.name == "tenant":  # only tenants this operator may see
            kwargs["queryset"] = access.scope(Tenant.objects.all(), request.user, "id")
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def has_add_permission(self, request: HttpRequest) -> bool:
        # Setting a tenant's first limits is changing them from the defaults: the same permission.
        return request.user.has_perm(access.CHANGE_LIMITS.permission)

    def has_change_permission(self, request: HttpRequest, obj: TenantLimits | None = None) -> bool:
        return request.user.has_perm(access.CHANGE_LIMITS.permission)

    def has_delete_permission(self, request: HttpRequest, obj: TenantLimits | None = None) -> bool:
        return False  # back to the defaults is an empty field, an audited change like any other

    def save_model(self, request: HttpRequest, obj: TenantLimits, form: Any, change: bool) -> None:
        try:
            saved = access.change_limits(obj.tenant, request.user, {name: form.cleaned_data[name]
                                                                    for name in LIMIT_FIELDS})
        except PermissionDenied as refused:
            raise Refused(refused.message) from None  # audited again after the rollback (RefusalsAuditedAdmin)
        obj.pk, obj._state.adding = saved.pk, False
