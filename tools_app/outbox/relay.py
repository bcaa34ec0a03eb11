"""The transactional outbox: messages written with the business change, delivered at least once.

`enqueue` runs inside the caller's transaction, so the event exists if and
only if the change committed. The relay never holds a row lock or a
transaction across a network delivery:

1. claim: one statement takes a batch of due events (`FOR UPDATE SKIP LOCKED`,
   so two relays never take the same one) and marks them claimed by this relay
   until `claimed_until` (the database's clock), then commits at once;
2. deliver: outside any transaction, on up to IDEMOPS_OUTBOX_DELIVERY_THREADS threads at
   once, so a slow or hanging consumer holds up only its own event (each
   delivery is bounded by its timeout);
3. record: each result, as soon as it is known, by one guarded transition (still
   pending, still claimed by this relay) with its audit event: delivered, or
   another attempt after core.backoff's delay, or dead-lettered past
   OUTBOX_MAX_ATTEMPTS (an operator re-drives it).

A webhook URL is checked against the allow-list again before each attempt
(tools_app.core.url_allowlist); one that fails it is dead-lettered at once, unsent.

A relay killed mid-batch leaves its events claimed until `claimed_until`; then
another relay claims them and delivers them again (the killed one may have
delivered some). Consumers that deduplicate by the event id (email Message-ID,
webhook `webhook-id`) act once. A webhook's tenant's signing secrets and a channel message's
Apprise URL are read before the delivery threads start (access.signing_secrets, channels.urls_of),
so those threads stay off the database.

Each event keeps the trace of the call that wrote it; each delivery attempt is a span in that
trace (its context goes to the consumer as `traceparent`) and one log line (`outbox.delivery`:
delivered, retry or dead, with the attempt and how long it took).
"""

from __future__ import annotations

import logging
import time
import uuid
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.db import connection, connections, transaction

from tools_app import access
from tools_app.conf import conf
from tools_app.core import backoff, clock, counters, db, jobs, leases, logs, redaction, tracing
from tools_app.outbox import channels
from tools_app.outbox.delivery import WEBHOOK_KINDS, DeliveryFailed, deliver
from tools_app.outbox.models import OutboxEvent, OutboxStatus

if TYPE_CHECKING:
    from django.contrib.auth.models import AnonymousUser, User

    from tools_app.engine.models import IdempotencyRecord

logger = logging.getLogger(__name__)
RELAY_ACTOR = "system:outbox-relay"


def enqueue(*, tenant_id: int, kind: str, payload: dict[str, Any], record: IdempotencyRecord | None = None,
            event_id: uuid.UUID | None = None) -> OutboxEvent:
    """Write an event in the current transaction and wake the relay when it commits.

    With `event_id` (a step that may run again after a crash derives it from its task), an event
    already written under that id is returned instead: one event however often the step runs.
    """
    now = clock.read()  # due now by the database's clock, which the relay compares it with
    trace_id, span_id = tracing.ids()
    fields = dict(tenant_id=tenant_id, record=record, kind=kind, payload=payload,
                  operation_id=record.operation_id if record is not None else None, next_attempt_at=now,
                  created_at=now, trace_id=trace_id, span_id=span_id)
    if event_id is not None:
        event, created = OutboxEvent.objects.get_or_create(pk=event_id, defaults=fields)
        if not created:
            return event
    else:
        event = OutboxEvent.objects.create(**fields)
    # The ORM broker's enqueue joins this transaction: no commit, no job.
    jobs.enqueue("outbox.relay", task_name="outbox-relay")
    return event


def find(tenant_id: int, event_id: Any) -> OutboxEvent | None:
    """One of this tenant's events by its id (a UUID or its text), or None: an id that is not one is
    nobody's event."""
    try:
        event_id = event_id if isinstance(event_id, uuid.UUID) else uuid.UUID(str(event_id))
    except ValueError:
        return None
    return OutboxEvent.objects.filter(tenant_id=tenant_id, pk=event_id).first()


# --- the relay ------------------------------------------------------------------------


@dataclass
class RelayReport:
    delivered: int = 0
    retried: int = 0
    dead: int = 0
    lost: int = 0  # delivered or failed, but the claim had run out and another relay had the event

    @property
    def handled(self) -> int:
        return self.delivered + self.retried + self.dead + self.lost


def claim_batch(owner: str, limit: int, *, event_id: uuid.UUID | None = None) -> list[OutboxEvent]:
    """Claim up to `limit` due events (only `event_id`, if given) for `owner`, until the claim runs
    out; committed at once."""
    _, columns = db.select_columns(OutboxEvent)
    table = db.table(OutboxEvent)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"""
            UPDATE {table} SET claimed_by = %s,
                   claimed_until = statement_timestamp() + make_interval(secs => %s)
            WHERE id IN (
                SELECT id FROM {table}
                WHERE status = %s AND next_attempt_at <= statement_timestamp()
                  AND (claimed_until IS NULL OR claimed_until < statement_timestamp())
                  AND (%s::uuid IS NULL OR id = %s::uuid)
                ORDER BY next_attempt_at, created_at
                LIMIT %s
                FOR UPDATE SKIP LOCKED)
            RETURNING {columns}""", [owner, conf().outbox_claim_seconds, OutboxStatus.PENDING,
                                  event_id, event_id, limit])
        rows = cursor.fetchall()
    return sorted((db.from_row(OutboxEvent, row) for row in rows), key=lambda e: (e.next_attempt_at, e.created_at))


def relay_batch(limit: int | None = None) -> RelayReport:
    """Claim one batch of due events, deliver them (no transaction open, several at once on
    delivery threads that do no database work) and record each result as it comes."""
    report = RelayReport()
    batch = claim_batch(leases.new_owner(), limit or conf().outbox_batch_size)
    if not batch:
        return report
    keys, urls = _signing_secrets(batch), _channel_urls(batch)
    with ThreadPoolExecutor(max_workers=min(len(batch), conf().outbox_delivery_threads),
                            thread_name_prefix="outbox-delivery") as pool:
        deliveries = {pool.submit(_delivery_thread, event, keys.get(event.tenant_id, []), _url(urls, event)): event
                      for event in batch}
        for done in as_completed(deliveries):
            outcome = _record(deliveries[done], *done.result())
            setattr(report, outcome, getattr(report, outcome) + 1)
    return report


def relay_one(event_id: uuid.UUID) -> RelayReport:
    """Deliver one event now if it is due and no relay holds it (a long task's step that must know
    how its message fared drives its delivery itself, instead of waiting for a free worker)."""
    report = RelayReport()
    for event in claim_batch(leases.new_owner(), 1, event_id=event_id):
        outcome = _record(event, *_deliver(event, _signing_secrets([event]).get(event.tenant_id, []),
                                           _url(_channel_urls([event]), event)))
        setattr(report, outcome, getattr(report, outcome) + 1)
    return report


def _signing_secrets(batch: list[OutboxEvent]) -> dict[int, list[str]]:
    """The secrets each webhook's tenant signs with, read before delivery (one query for the batch)."""
    return access.signing_secrets({event.tenant_id for event in batch if event.kind in WEBHOOK_KINDS})


def _channel_urls(batch: list[OutboxEvent]) -> dict[int, str]:
    """The opened URLs of the channels the batch's channel messages go to (one query for the batch)."""
    return channels.urls_of({event.payload.get("channel") for event in batch if event.kind == channels.CHANNEL_KIND})


def _url(urls: dict[int, str], event: OutboxEvent) -> str:
    return urls.get(event.payload.get("channel"), "") if event.kind == channels.CHANNEL_KIND else ""


def _delivery_thread(event: OutboxEvent, signing_secrets: list[str], channel_url: str = ""
                     ) -> tuple[DeliveryFailed | None, float, Any]:
    try:
        return _deliver(event, signing_secrets, channel_url)
    finally:
        connections.close_all()  # this thread's, if anything in the delivery opened one


def _deliver(event: OutboxEvent, signing_secrets: list[str], channel_url: str = ""
             ) -> tuple[DeliveryFailed | None, float, Any]:
    """Deliver one event inside its span, in the trace of the call that wrote it (the consumer gets
    its `traceparent`): (the failure or None, seconds taken, the span)."""
    # The payload is the caller's (an address, a message): no line may show it, an SMTP error included.
    scrubbed = redaction.scrubbed_arguments(event.payload, event.payload.keys())
    started, failure = time.perf_counter(), None
    with tracing.continued(event.trace_id, event.span_id, "outbox.deliver", **{
            "idemops.outbox_event": str(event.id), "idemops.kind": event.kind, "idemops.attempt": event.attempts + 1}
                           ) as span, logs.scrubbing(scrubbed):
        try:
            deliver(event, signing_secrets, channel_url)
        except DeliveryFailed as exc:
            failure = exc
        except Exception as exc:  # a bug in a delivery must not stop the others: it counts as a failed attempt
            logger.exception("delivering outbox event %s raised", event.pk)
            failure = DeliveryFailed(f"{type(exc).__name__}: {exc}"[:300])
        span.set_attribute("idemops.delivered", failure is None)
    return failure, time.perf_counter() - started, span


def _record(event: OutboxEvent, failure: DeliveryFailed | None, seconds: float, span: Any) -> str:
    """Record a delivery attempt (guarded by the relay's claim), count it and log its line in the
    delivery's span; "delivered", "retried", "dead" or "lost"."""
    scrubbed = redaction.scrubbed_arguments(event.payload, event.payload.keys())
    token = tracing.attach(tracing.set_span(span))
    try:
        with logs.bound(tenant_id=event.tenant_id, outbox_event=str(event.id), kind=event.kind), \
                logs.scrubbing(scrubbed):
            attempt = event.attempts + 1
            if failure is None:
                outcome = "delivered" if mark_delivered(event) else "lost"
                if outcome == "delivered" and event.delivered_at is not None:  # mark_delivered set it
                    counters.observe(counters.OUTBOX_DELIVERY,
                                     (event.delivered_at - event.created_at).total_seconds(), tenant_id=event.tenant_id)
            else:
                outcome = _record_failure(event, str(failure), final=failure.final)
            log = logs.get(__name__).warning if outcome == "dead" else logs.get(__name__).info
            log("outbox.delivery", outcome=outcome, attempt=attempt, error=str(failure) if failure else None,
                duration_ms=round(seconds * 1000, 3))
            return outcome
    finally:
        tracing.detach(token)


def mark_delivered(event: OutboxEvent) -> bool:
    """pending -> delivered, by the relay that holds its claim."""
    attempts = event.attempts + 1
    return db.transition(event, {"status": OutboxStatus.PENDING, "claimed_by": event.claimed_by}, {
        "status": OutboxStatus.DELIVERED, "delivered_at": clock.NOW, "attempts": attempts, "last_error": "",
        **RELEASED,
    }, action="outbox.delivered", actor=RELAY_ACTOR, before={"status": OutboxStatus.PENDING},
        after={"status": OutboxStatus.DELIVERED, "attempts": attempts})


# The longest wait between two delivery attempts of an event.
BACKOFF_MAX_SECONDS = 3600


# What recording an attempt's result sets: the relay's claim is over.
RELEASED = {"claimed_by": "", "claimed_until": None}


def record_failed_attempt(event: OutboxEvent, error: str, *, final: bool = False) -> bool:
    """pending -> pending later (core.backoff), or -> dead after the last attempt (or at once if
    `final`), by the relay that holds its claim. Returns True if dead-lettered."""
    return _record_failure(event, error, final=final) == "dead"


def _record_failure(event: OutboxEvent, error: str, *, final: bool) -> str:
    """record_failed_attempt's work; "dead", "retried", or "lost" (the claim ran out and another
    relay has the event)."""
    attempts = event.attempts + 1
    dead = final or attempts >= conf().outbox_max_attempts
    delay = backoff.delay(attempts, base=conf().outbox_backoff_seconds, ceiling=BACKOFF_MAX_SECONDS)
    changes = {"attempts": attempts, "last_error": error, "next_attempt_at": clock.later(delay), **RELEASED}
    expected = {"status": OutboxStatus.PENDING, "attempts": event.attempts, "claimed_by": event.claimed_by}
    if dead:
        recorded = db.transition(event, expected, {**changes, "status": OutboxStatus.DEAD},
                                 action="outbox.dead_lettered", actor=RELAY_ACTOR, reason=error,
                                 after={"attempts": attempts})
    else:
        recorded = db.transition(event, expected, changes, action="outbox.retry_scheduled", actor=RELAY_ACTOR,
                                 reason=error, after={"attempts": attempts, "retry_in_seconds": round(delay, 3)})
    if not recorded:
        return "lost"
    return "dead" if dead else "retried"


REDRIVE = access.Permit("tools_app.redrive_outboxevent", "redrive", "re-drive dead-lettered events",
                        "outbox.redrive_refused")


def redrive(event: OutboxEvent, user: User | AnonymousUser, *, reason: str = "") -> bool:
    """dead -> pending, attempts reset: an operator sends it again."""
    actor = access.authorize(user, REDRIVE, event)
    with transaction.atomic():
        if not db.transition(event, {"status": OutboxStatus.DEAD}, {
            "status": OutboxStatus.PENDING, "attempts": 0, "next_attempt_at": clock.NOW, **RELEASED,
        }, action="outbox.redriven", actor=actor, reason=reason, before={"status": OutboxStatus.DEAD},
                after={"status": OutboxStatus.PENDING}):
            return False
        jobs.enqueue("outbox.relay", task_name="outbox-relay")
    return True
