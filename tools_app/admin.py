from django.contrib import admin

from tools_app.models import ApiToken, AuditEvent, IdempotencyRecord, Order, Tenant, Ticket


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "created_at"]
    search_fields = ["slug", "name"]


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ["tenant", "name", "prefix", "created_at", "last_used_at", "revoked_at"]
    list_filter = ["tenant"]
    readonly_fields = ["prefix", "digest", "created_at", "last_used_at"]


@admin.register(IdempotencyRecord)
class IdempotencyRecordAdmin(admin.ModelAdmin):
    list_display = ["id", "tenant", "tool", "status", "attempts", "created_at", "expires_at"]
    list_filter = ["status", "tool", "tenant"]
    search_fields = ["=operation_id", "=trace_id"]
    date_hierarchy = "created_at"

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(AuditEvent)
class AuditEventAdmin(admin.ModelAdmin):
    list_display = ["id", "created_at", "tenant", "actor", "action", "object_type", "object_id"]
    list_filter = ["action", "object_type", "tenant"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


admin.site.register(Order)
admin.site.register(Ticket)
