"""Operators see only the tenants they are granted (superusers see all)."""

from tools_app.tenants import visible_tenant_ids


class TenantScopedAdmin:
    """Mixin for ModelAdmins of models with a `tenant` field."""

    tenant_field = "tenant_id"

    def get_queryset(self, request):
        queryset = super().get_queryset(request)
        visible = visible_tenant_ids(request.user)
        if visible is None:
            return queryset
        return queryset.filter(**{f"{self.tenant_field}__in": visible})
