from django.contrib import admin

from tools_app.models import IdempotencyRecord


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
