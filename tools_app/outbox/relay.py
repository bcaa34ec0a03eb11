"""The transactional outbox: messages written with the business change, delivered at least once.

`enqueue` runs inside the caller's transaction, so the event exists if and
only if the change committed. The relay claims a batch with
`SELECT ... FOR UPDATE SKIP LOCKED` (two relays never take the same event),
delivers each, and marks it delivered or schedules another attempt with
exponential backoff and jitter; past OUTBOX_MAX_ATTEMPTS an event is
dead-lettered and waits for an operator to re-drive it. A webhook URL is
checked against the allow-list again before each attempt (tools_app.url_allowlist);
one that fails it is dead-lettered at once, unsent.

A relay killed mid-batch delivers some events without marking them; its
transaction rolls back and they are delivered again. Consumers deduplicate by
the event id (email Message-ID, webhook X-Event-Id), so each effect happens once.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from idemops.conf import conf
from tools_app.access import tenants
from tools_app.core import audit, jobs
from tools_app.outbox.delivery import DeliveryFailed, deliver
from tools_app.outbox.models import OutboxEvent, OutboxStatus

logger = logging.getLogger(__name__)
RELAY_ACTOR = "system:outbox-relay"


def enqueue(*, tenant_id: int, kind: str, payload: dict[str, Any], record=None) -> OutboxEvent:
    """Write an event in the current transaction and wake the relay when it commits."""
    now = timezone.now()
    event = OutboxEvent.objects.create(tenant_id=tenant_id, record=record, kind=kind, payload=payload,
                                       next_attempt_at=now, created_at=now)
    # The ORM broker's enqueue joins this transaction: no commit, no job.
    jobs.enqueue("outbox.relay", task_name="outbox-relay")
    return event


# --- the relay ------------------------------------------------------------------------


@dataclass
class RelayReport:
    delivered: int = 0
    retried: int = 0
    dead: int = 0

    @property
    def handled(self) -> int:
        return self.delivered + self.retried + self.dead


def relay_batch(limit: int | None = None) -> RelayReport:
    """Deliver one batch of due events. Rows stay locked until this transaction ends."""
    report = RelayReport()
    with transaction.atomic():
        batch = list(OutboxEvent.objects.select_for_update(skip_locked=True)
                     .filter(status=OutboxStatus.PENDING, next_attempt_at__lte=timezone.now())
                     .order_by("next_attempt_at", "created_at")[:limit or conf().outbox_batch_size])
        for event in batch:
            try:
                deliver(event)
            except DeliveryFailed as exc:
                if record_failed_attempt(event, str(exc), final=exc.final):
                    report.dead += 1
                else:
                    report.retried += 1
                continue
            mark_delivered(event)
            report.delivered += 1
    return report


def mark_delivered(event: OutboxEvent) -> bool:
    """pending -> delivered."""
    return bool(OutboxEvent.objects.filter(pk=event.pk, status=OutboxStatus.PENDING).update(
        status=OutboxStatus.DELIVERED, delivered_at=timezone.now(), attempts=event.attempts + 1, last_error=""))


def record_failed_attempt(event: OutboxEvent, error: str, *, final: bool = False) -> bool:
    """pending -> pending later, or -> dead after the last attempt (or at once if `final`).
    Returns True if dead-lettered."""
    attempts = event.attempts + 1
    dead = final or attempts >= conf().outbox_max_attempts
    delay = conf().outbox_backoff_seconds * 2 ** (attempts - 1) * random.uniform(0.5, 1.5)
    changes = {"attempts": attempts, "last_error": error,
               "next_attempt_at": timezone.now() + timedelta(seconds=min(delay, 3600))}
    if dead:
        changes["status"] = OutboxStatus.DEAD
    moved = OutboxEvent.objects.filter(pk=event.pk, status=OutboxStatus.PENDING, attempts=event.attempts).update(
        **changes)
    if moved and dead:
        audit.record_event(action="outbox.dead_lettered", obj=event, actor=RELAY_ACTOR, reason=error,
                           after={"attempts": attempts})
    return dead


REDRIVE = tenants.Permit("tools_app.redrive_outboxevent", "redrive", "re-drive dead-lettered events",
                         "outbox.redrive_refused")


def redrive(event: OutboxEvent, user, *, reason: str = "") -> bool:
    """dead -> pending, attempts reset: an operator sends it again."""
    actor = tenants.authorize(user, REDRIVE, event)
    with transaction.atomic():
        if not OutboxEvent.objects.filter(pk=event.pk, status=OutboxStatus.DEAD).update(
                status=OutboxStatus.PENDING, attempts=0, next_attempt_at=timezone.now()):
            return False
        audit.record_event(action="outbox.redriven", obj=event, actor=actor, reason=reason,
                           before={"status": OutboxStatus.DEAD}, after={"status": OutboxStatus.PENDING})
        jobs.enqueue("outbox.relay", task_name="outbox-relay")
    return True
