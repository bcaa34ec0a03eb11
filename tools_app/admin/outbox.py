"""Outbox events, and the dead-letter queue with its re-drive action."""

from django.contrib import admin
from django.http import HttpRequest

from tools_app import outbox
from tools_app.admin.big_lists import DateRangeFilter, RecentValuesFilter, TenantFilter
from tools_app.admin.operator_actions import OperatorAction, QueueAdmin, age
from tools_app.admin.scoping import ListedFromReplica, ReadOnlyAdmin, TenantScopedAdmin
from tools_app.core.errors import Refused
from tools_app.outbox.models import DeadLetter, OutboxEvent, OutboxStatus


@admin.register(OutboxEvent)
class OutboxEventAdmin(ListedFromReplica[OutboxEvent], TenantScopedAdmin[OutboxEvent], ReadOnlyAdmin[OutboxEvent]):
    list_display = ["id", "tenant", "kind", "status", "attempts", "next_attempt_at", "created_at", "delivered_at",
                    "last_error"]
    list_filter = ["status", ("kind", RecentValuesFilter), ("tenant", TenantFilter), ("created_at", DateRangeFilter),
                   ("delivered_at", DateRangeFilter)]
    list_select_related = ["tenant"]
    search_fields = ["=id"]
    ordering = ["-created_at"]


def redrive(request: HttpRequest, event: DeadLetter, reason: str) -> str:
    if not outbox.redrive(event, request.user, reason=reason):
        raise Refused("it is no longer dead-lettered")
    return "sent back to the relay"


@admin.register(DeadLetter)
class DeadLetterAdmin(QueueAdmin[DeadLetter]):
    queue_filter = {"status": OutboxStatus.DEAD}
    what_to_do = ("Outbox messages (notification email and webhooks, approvers' messages) the relay gave up on "
                  "after its attempts. Read the last error and fix its cause (the receiver, the address, the "
                  "allow-list), then Re-drive: the relay delivers it again and the receiver deduplicates by "
                  "event id, so it takes effect once.")
    list_display = ["id", "tenant", "kind", "waiting", "attempts", "last_error"]
    list_filter = ["kind", ("tenant", admin.RelatedOnlyFieldListFilter)]
    list_select_related = ["tenant"]
    operator_actions = [OperatorAction("redrive", "Re-drive", outbox.REDRIVE, redrive, refused=(Refused,),
                                       help_text="Deliver again; the consumer deduplicates by event id.")]

    @admin.display(description="waiting", ordering="created_at")
    def waiting(self, event: DeadLetter) -> str:
        return age(event.created_at)
