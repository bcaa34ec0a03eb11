"""Tenant scoping and read-only evidence, for every admin page that shows tenant data.

A superuser sees every tenant; anyone else only the tenants granted to them
by TenantAccess (tools_app.tenants.visible_tenant_ids). Scoping the queryset
also scopes the change pages and actions, which look objects up through it.
"""

from django.contrib import admin

from tools_app.access.tenants import visible_tenant_ids


class TenantScopedAdmin:
    """Mixin for ModelAdmins of models with a tenant (put it before the ModelAdmin base)."""

    tenant_field = "tenant_id"  # the lookup path to the tenant id, e.g. "request__tenant_id"

    def get_queryset(self, request):
        return scope(super().get_queryset(request), request.user, self.tenant_field)


def scope(queryset, user, tenant_field: str = "tenant_id"):
    visible = visible_tenant_ids(user)
    if visible is None:
        return queryset
    return queryset.filter(**{f"{tenant_field}__in": visible})


class ReadOnlyAdmin(admin.ModelAdmin):
    """Evidence is shown, never edited: no add, change or delete, whoever asks."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
