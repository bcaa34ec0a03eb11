from django.contrib import admin

from tools_app.models import ApiToken, Tenant, TenantAccess


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "created_at"]
    search_fields = ["slug", "name"]


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ["tenant", "name", "prefix", "created_at", "last_used_at", "revoked_at"]
    list_filter = ["tenant"]
    readonly_fields = ["prefix", "digest", "created_at", "last_used_at"]


@admin.register(TenantAccess)
class TenantAccessAdmin(admin.ModelAdmin):
    list_display = ["user", "tenant", "granted_at"]
    list_filter = ["tenant"]
