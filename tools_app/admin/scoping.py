"""Tenant scoping and read-only evidence, for every admin page that shows tenant data.

A superuser sees every tenant; anyone else only the tenants granted to them
by TenantAccess (access.scope). Scoping the queryset also scopes the change
pages and actions, which look objects up through it; a form's tenant field
offers only those tenants.
"""

from django.contrib import admin

from tools_app import access
from tools_app.access.models import Tenant


class TenantScopedAdmin:
    """Mixin for ModelAdmins of models with a tenant (put it before the ModelAdmin base)."""

    tenant_field = "tenant_id"  # the lookup path to the tenant id, e.g. "request__tenant_id"

    def get_queryset(self, request):
        return access.scope(super().get_queryset(request), request.user, self.tenant_field)

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        if db_field.name == "tenant":  # a form names no tenant this user may not see
            kwargs["queryset"] = access.scope(Tenant.objects.all(), request.user, "pk")
        return super().formfield_for_foreignkey(db_field, request, **kwargs)


class ReadOnlyAdmin(admin.ModelAdmin):
    """Evidence is shown, never edited: no add, change or delete, whoever asks."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
