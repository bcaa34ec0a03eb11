"""Outbox events, and the dead-letter queue with its re-drive action."""

from django.contrib import admin

from tools_app import outbox
from tools_app.admin.scoping import TenantScopedAdmin
from tools_app.models import DeadLetter, OutboxEvent


class ReadOnlyAdmin(TenantScopedAdmin, admin.ModelAdmin):
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(OutboxEvent)
class OutboxEventAdmin(ReadOnlyAdmin):
    list_display = ["id", "tenant", "kind", "status", "attempts", "next_attempt_at", "created_at", "delivered_at"]
    list_filter = ["status", "kind", "tenant"]
    search_fields = ["=id"]
    ordering = ["-created_at"]


@admin.register(DeadLetter)
class DeadLetterAdmin(ReadOnlyAdmin):
    list_display = ["id", "tenant", "kind", "attempts", "last_error", "created_at"]
    list_filter = ["kind", "tenant"]
    ordering = ["created_at"]
    actions = ["redrive"]

    def has_redrive_permission(self, request):
        return request.user.has_perm("tools_app.redrive_outboxevent")

    @admin.action(description="Re-drive (deliver again)", permissions=["redrive"])
    def redrive(self, request, queryset):
        actor = f"user:{request.user.get_username()}"
        done = sum(outbox.redrive(event, actor=actor, reason="re-driven from the admin") for event in queryset)
        self.message_user(request, f"{done} event(s) sent back to the relay")
