"""The transactional outbox: messages written with the business change, delivered at least once.

`enqueue` runs inside the caller's transaction, so the event exists if and
only if the change committed. The relay claims a batch with
`SELECT ... FOR UPDATE SKIP LOCKED` (two relays never take the same event),
delivers each, and marks it delivered or schedules another attempt after
core.backoff's delay; past OUTBOX_MAX_ATTEMPTS an event is dead-lettered and
waits for an operator to re-drive it. Each of these moves is one guarded
transition with its audit event (core.db.transition). A webhook URL is
checked against the allow-list again before each attempt (tools_app.core.url_allowlist);
one that fails it is dead-lettered at once, unsent.

A relay killed mid-batch delivers some events without marking them; its
transaction rolls back and they are delivered again. Consumers deduplicate by
the event id (email Message-ID, webhook X-Event-Id), so each effect happens once.

Each event keeps the trace of the call that wrote it; each delivery attempt is a span in that
trace (its context goes to the consumer as `traceparent`) and one log line (`outbox.delivery`:
delivered, retry or dead, with the attempt and how long it took).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from idemops.conf import conf
from tools_app import access
from tools_app.core import backoff, counters, db, jobs, logs, redaction, tracing
from tools_app.outbox.delivery import DeliveryFailed, deliver
from tools_app.outbox.models import OutboxEvent, OutboxStatus

logger = logging.getLogger(__name__)
RELAY_ACTOR = "system:outbox-relay"


def enqueue(*, tenant_id: int, kind: str, payload: dict[str, Any], record=None) -> OutboxEvent:
    """Write an event in the current transaction and wake the relay when it commits."""
    now = timezone.now()
    trace_id, span_id = tracing.ids()
    event = OutboxEvent.objects.create(tenant_id=tenant_id, record=record, kind=kind, payload=payload,
                                       operation_id=record.operation_id if record is not None else None,
                                       next_attempt_at=now, created_at=now, trace_id=trace_id, span_id=span_id)
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
            outcome = _relay_one(event)
            setattr(report, outcome, getattr(report, outcome) + 1)
    return report


def _relay_one(event: OutboxEvent) -> str:
    """Deliver one event and record the attempt; "delivered", "retried" or "dead"."""
    # The payload is the caller's (an address, a message): no line may show it, an SMTP error included.
    scrubbed = redaction.scrubbed_arguments(event.payload, event.payload.keys())
    with tracing.continued(event.trace_id, event.span_id, "outbox.deliver", **{
            "idemops.outbox_event": str(event.id), "idemops.kind": event.kind, "idemops.attempt": event.attempts + 1}
                           ) as span, \
            logs.bound(tenant_id=event.tenant_id, outbox_event=str(event.id), kind=event.kind), \
            logs.scrubbing(scrubbed):
        started = time.perf_counter()
        error = ""
        try:
            deliver(event)
        except DeliveryFailed as exc:
            error = str(exc)
            outcome = "dead" if record_failed_attempt(event, error, final=exc.final) else "retried"
        else:
            if mark_delivered(event):
                counters.observe(counters.OUTBOX_DELIVERY, (event.delivered_at - event.created_at).total_seconds(),
                                 tenant_id=event.tenant_id)
            outcome = "delivered"
        span.set_attribute("idemops.outcome", outcome)
        log = logs.get(__name__).warning if outcome == "dead" else logs.get(__name__).info
        log("outbox.delivery", outcome=outcome, attempt=event.attempts, error=error or None,
            duration_ms=round((time.perf_counter() - started) * 1000, 3))
        return outcome


def mark_delivered(event: OutboxEvent) -> bool:
    """pending -> delivered."""
    attempts = event.attempts + 1
    return db.transition(event, {"status": OutboxStatus.PENDING}, {
        "status": OutboxStatus.DELIVERED, "delivered_at": timezone.now(), "attempts": attempts, "last_error": "",
    }, action="outbox.delivered", actor=RELAY_ACTOR, before={"status": OutboxStatus.PENDING},
        after={"status": OutboxStatus.DELIVERED, "attempts": attempts})


# The longest wait between two delivery attempts of an event.
BACKOFF_MAX_SECONDS = 3600


def record_failed_attempt(event: OutboxEvent, error: str, *, final: bool = False) -> bool:
    """pending -> pending later (core.backoff), or -> dead after the last attempt (or at once if
    `final`). Returns True if dead-lettered."""
    attempts = event.attempts + 1
    dead = final or attempts >= conf().outbox_max_attempts
    delay = backoff.delay(attempts, base=conf().outbox_backoff_seconds, ceiling=BACKOFF_MAX_SECONDS)
    changes = {"attempts": attempts, "last_error": error, "next_attempt_at": timezone.now() + timedelta(seconds=delay)}
    if dead:
        db.transition(event, {"status": OutboxStatus.PENDING, "attempts": event.attempts},
                      {**changes, "status": OutboxStatus.DEAD}, action="outbox.dead_lettered", actor=RELAY_ACTOR,
                      reason=error, after={"attempts": attempts})
    else:
        db.transition(event, {"status": OutboxStatus.PENDING, "attempts": event.attempts}, changes,
                      action="outbox.retry_scheduled", actor=RELAY_ACTOR, reason=error,
                      after={"attempts": attempts, "retry_in_seconds": round(delay, 3)})
    return dead


REDRIVE = access.Permit("tools_app.redrive_outboxevent", "redrive", "re-drive dead-lettered events",
                        "outbox.redrive_refused")


def redrive(event: OutboxEvent, user, *, reason: str = "") -> bool:
    """dead -> pending, attempts reset: an operator sends it again."""
    actor = access.authorize(user, REDRIVE, event)
    with transaction.atomic():
        if not db.transition(event, {"status": OutboxStatus.DEAD}, {
            "status": OutboxStatus.PENDING, "attempts": 0, "next_attempt_at": timezone.now(),
        }, action="outbox.redriven", actor=actor, reason=reason, before={"status": OutboxStatus.DEAD},
                after={"status": OutboxStatus.PENDING}):
            return False
        jobs.enqueue("outbox.relay", task_name="outbox-relay")
    return True
