"""What outbox events keep past their call's retention (retention.purge calls it in its batch)."""

from __future__ import annotations

from collections.abc import Iterable

from django.db.models import Case, Value, When

from tools_app.outbox.models import OutboxEvent, OutboxStatus

PURGED = "purged past its retention"


def forget_payloads(record_ids: Iterable[int]) -> int:
    """The events of these (purged) records lose their payload (recipients, subjects, bodies) and last
    error (which may quote them); one still pending is dead-lettered, never delivered empty. Returns how many."""
    return OutboxEvent.objects.filter(record_id__in=list(record_ids)).update(
        payload={},
        last_error=Case(When(status=OutboxStatus.PENDING, then=Value(PURGED)), default=Value("")),
        status=Case(When(status=OutboxStatus.PENDING, then=Value(OutboxStatus.DEAD)), default="status"))
