"""Tenants, their API tokens and who may see them. Changes go through tools_app.access and
tools_app.access.roles, which audit them: tokens are issued by `manage.py create_tenant / issue_token`
(shown once), access by `manage.py grant_role`."""

from django.contrib import admin

from tools_app import access
from tools_app.access.models import ApiToken, Tenant, TenantAccess
from tools_app.admin.scoping import ReadOnlyAdmin
from tools_app.core import audit


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "created_at"]
    search_fields = ["slug", "name"]

    def save_model(self, request, obj, form, change):
        if change:
            super().save_model(request, obj, form, change)
            return
        created = access.create_tenant(obj.slug, obj.name, actor=audit.user_actor(request.user))
        obj.pk, obj._state.adding = created.pk, False


@admin.register(ApiToken)
class ApiTokenAdmin(ReadOnlyAdmin):
    list_display = ["tenant", "name", "prefix", "created_at", "last_used_at", "revoked_at"]
    list_filter = [("tenant", admin.RelatedOnlyFieldListFilter), ("revoked_at", admin.EmptyFieldListFilter)]
    list_select_related = ["tenant"]
    actions = ["revoke"]

    @admin.action(description="Revoke the selected tokens", permissions=["revoke"])
    def revoke(self, request, queryset):
        actor = audit.user_actor(request.user)
        revoked = sum(access.revoke_token(token, actor=actor, reason="revoked in the admin") for token in queryset)
        self.message_user(request, f"{revoked} token(s) revoked")

    def has_revoke_permission(self, request):
        return request.user.is_superuser


@admin.register(TenantAccess)
class TenantAccessAdmin(ReadOnlyAdmin):
    list_display = ["user", "tenant", "granted_at"]
    list_filter = [("tenant", admin.RelatedOnlyFieldListFilter)]
    list_select_related = ["user", "tenant"]
