"""The business objects the demo's tools created (orders, tickets, announcements, customers, documents):
shown in the console, never edited there.

They change only through their tools, under the idempotency engine and the audit log.
"""

from django.contrib import admin

from idemops.tools import ReadOnlyAdmin, TenantScopedAdmin
from idemops_demo.documents.models import Document
from idemops_demo.models import Announcement, Customer, Order, Ticket


@admin.register(Order)
class OrderAdmin(TenantScopedAdmin[Order], ReadOnlyAdmin[Order]):
    list_display = ["id", "tenant", "customer", "total", "currency", "created_at"]
    list_filter = [("tenant", admin.RelatedOnlyFieldListFilter)]


@admin.register(Ticket)
class TicketAdmin(TenantScopedAdmin[Ticket], ReadOnlyAdmin[Ticket]):
    list_display = ["id", "tenant", "subject", "priority", "status", "assignee", "created_at"]
    list_filter = ["priority", "status", ("tenant", admin.RelatedOnlyFieldListFilter)]


@admin.register(Announcement)
class AnnouncementAdmin(TenantScopedAdmin[Announcement], ReadOnlyAdmin[Announcement]):
    list_display = ["id", "tenant", "title", "audience", "published_at"]
    list_filter = ["audience", ("tenant", admin.RelatedOnlyFieldListFilter)]


@admin.register(Customer)
class CustomerAdmin(TenantScopedAdmin[Customer], ReadOnlyAdmin[Customer]):
    """Customers onboard_customer made; a closed one was undone by its saga (see its task)."""

    list_display = ["id", "tenant", "name", "email", "status", "mandate_id", "created_at", "closed_at"]
    list_filter = ["status", ("tenant", admin.RelatedOnlyFieldListFilter)]
    search_fields = ["name", "email", "mandate_id"]


DOCUMENT_FIELDS = ("tenant", "task", "title", "format", "source", "content_sha256", "characters", "chunk_count",
                   "summary", "created_at", "ready_at")


@admin.register(Document)
class DocumentAdmin(TenantScopedAdmin[Document], ReadOnlyAdmin[Document]):
    list_display = ["id", "tenant", "title", "format", "characters", "chunk_count", "created_at", "ready_at"]
    list_filter = ["format", ("tenant", admin.RelatedOnlyFieldListFilter)]
    search_fields = ["title"]
    list_select_related = ["tenant"]
    fields = readonly_fields = DOCUMENT_FIELDS
