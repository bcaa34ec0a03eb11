"""The business objects the tools created (orders, tickets, announcements): shown, never edited here.

They change only through their tools, under the idempotency engine and the audit log.
"""

from django.contrib import admin

from tools_app.admin.scoping import ReadOnlyAdmin, TenantScopedAdmin
from tools_app.tools.models import Announcement, Order, Ticket


@admin.register(Order)
class OrderAdmin(TenantScopedAdmin, ReadOnlyAdmin):
    list_display = ["id", "tenant", "customer", "total", "currency", "created_at"]
    list_filter = [("tenant", admin.RelatedOnlyFieldListFilter)]


@admin.register(Ticket)
class TicketAdmin(TenantScopedAdmin, ReadOnlyAdmin):
    list_display = ["id", "tenant", "subject", "priority", "status", "created_at"]
    list_filter = ["priority", "status", ("tenant", admin.RelatedOnlyFieldListFilter)]


@admin.register(Announcement)
class AnnouncementAdmin(TenantScopedAdmin, ReadOnlyAdmin):
    list_display = ["id", "tenant", "title", "audience", "published_at"]
    list_filter = ["audience", ("tenant", admin.RelatedOnlyFieldListFilter)]
