from django.contrib import admin

from tools_app.models import AuditEvent


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
