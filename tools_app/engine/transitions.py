"""Every change of an idempotency record after its claim: one function each.

Each is a conditional UPDATE guarded by the status (and lease owner) it expects, plus its audit
event, in one statement (`_transition`, a thin wrapper of core.db.transition); a False or None
answer means someone else moved the record first and nothing was written. The claim that inserts
the record, and the reclaim of a transient failure, are in `claims.py`.

The executor holds a short lease (EXECUTION_LEASE_SECONDS), renewed by a heartbeat while its
handler runs (tools_app.core.leases); `expire_lease` is taken by the sweep and by a follower
that finds the lease expired.

Every time that decides something (lease expiries, retention, when a retry or a reconciliation
is due) is the database's (core.clock): written as `NOW`/`later()` in the statement, compared
in SQL, or compared with the database's time of the read (`read_at`, which `claims.claim` and
`reread` set), never with this host's clock.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db import connection, transaction
from django.db.models import Expression, F
from django.db.models.functions import Coalesce

from tools_app.conf import conf
from tools_app.core import backoff, clock, counters, db, leases, logs, personal
from tools_app.core.errors import RETRYABLE, NotExecuted, ToolFailure, UnknownOutcome
from tools_app.engine.models import IdempotencyRecord, RecordStatus
from tools_app.engine.operation import (
    LeaseLost,
    evidence_entry,
    searchable,
)

FINISHED = (RecordStatus.SUCCEEDED, RecordStatus.FAILED)


LEASE_SWEEPER = "system:lease-sweep"

# A transient failure of a write without a Retry-After of its own (the database failed and rolled back, a
# downstream that could not be reached) may run again after backoff.delay(attempts, ...): the
# agent is told so as `retry_after`, and a retry before then is answered the same.
WRITE_RETRY_BASE_SECONDS = 1.0
WRITE_RETRY_MAX_SECONDS = 60.0


def lease_seconds() -> float:
    return conf().execution_lease_seconds


def heartbeat_interval() -> float:
    return leases.heartbeat_interval(conf().execution_heartbeat_seconds, lease_seconds())


@transaction.atomic
def renew_lease(record: IdempotencyRecord) -> bool:
    """Extend the executor's lease while its handler runs. False: the record is no longer
    ours (a follower or the sweep took it for dead).

    Liveness, not a state change: no audit event. Guarded by the owner only,
    not the expiry: a lease that ran out but that nobody took yet is still ours.
    """
    # Never queue behind a lock on the row: if the executor's own transaction
    # held one, the executor would wait for its heartbeat (it joins it) while
    # the heartbeat waited for the executor. A beat that times out is skipped.
    with connection.cursor() as cursor:
        cursor.execute(f"SET LOCAL lock_timeout = {max(1, int(heartbeat_interval() * 500))}")
    return bool(IdempotencyRecord.objects.filter(
        pk=record.pk, status=RecordStatus.PROCESSING, lease_owner=record.lease_owner,
    ).update(lease_expires_at=leases.expiry(lease_seconds())))


def heartbeat(record: IdempotencyRecord) -> leases.Heartbeat:
    return leases.Heartbeat(lambda: renew_lease(record), heartbeat_interval(), name=f"lease-of-record-{record.pk}")


def reread(record: IdempotencyRecord) -> IdempotencyRecord:
    """Read the record again, with the database's time of the read (`read_at`)."""
    fresh = IdempotencyRecord.objects.annotate(read_at=clock.NOW).get(pk=record.pk)
    record.__dict__.update({f.attname: getattr(fresh, f.attname) for f in IdempotencyRecord._meta.concrete_fields},
                           read_at=fresh.read_at)
    return record


def _transition(record: IdempotencyRecord, expected: dict[str, Any], changes: dict[str, Any], *, action: str,
                actor: str, reason: str = "", evidence: dict[str, Any] | list[dict[str, Any]] | None = None,
                trace_id: str = "", before: dict[str, Any] | None = None,
                after: dict[str, Any] | None = None, attributes: dict[str, str] | None = None) -> bool:
    """core.db.transition for a record: it also stamps `updated_at`, the event records the status
    before and after (unless told otherwise), `evidence`, if any, is appended to the record's, and
    `attributes` (search fields found in a result) are added to its attributes."""
    changes = {**changes, "updated_at": clock.NOW}
    entries = [evidence] if isinstance(evidence, dict) else list(evidence or [])
    entries = personal.sealing_list(entries, record.tenant_id)  # sealed as it is appended (core.personal)
    append: dict[str, list[Any] | dict[str, Any]] = {"evidence": entries} if entries else {}
    if attributes:
        append["attributes"] = attributes
    return db.transition(
        record, expected, changes, action=action, actor=actor, reason=reason, trace_id=trace_id or record.trace_id,
        before=before or {"status": record.status},
        after=after or {"status": changes.get("status", record.status),
                        **({"error_class": changes["error_class"]} if changes.get("error_class") else {})},
        append=append or None)


def _sealing(record: IdempotencyRecord, result: Any) -> Any:
    """The result as stored: its personal values encrypted, kept as long as the record's key (core.personal)."""
    try:
        kept = record.expires_at - record.created_at
    except TypeError:  # a time not read back yet
        kept = timedelta(0)
    return personal.sealing(result, record.tenant_id, kept if isinstance(kept, timedelta) else timedelta(0))


def _finished() -> dict[str, Any]:
    """Fields every move to a final status sets: retention counts from the finish."""
    return {"finished_at": clock.NOW, "expires_at": RETAINED_FROM_NOW}


# A finished record is kept as long from its finish as it was set to be kept from its start.
RETAINED_FROM_NOW = clock.NOW + (F("expires_at") - F("created_at"))


def mark_succeeded(record: IdempotencyRecord, result: dict[str, Any], *, actor: str,
                   evidence: list[dict[str, Any]] | None = None,
                   search_fields: frozenset[str] = frozenset()) -> IdempotencyRecord:
    """PROCESSING -> SUCCEEDED, by the lease holder. Call inside the business transaction. The
    result's `search_fields` join the record's attributes."""
    if not _transition(record, {"status": RecordStatus.PROCESSING, "lease_owner": record.lease_owner}, {
        "status": RecordStatus.SUCCEEDED, "result": _sealing(record, result), "lease_owner": "",
        "lease_expires_at": None, "error_class": "", "error_message": "", **_finished(),
    }, action="record.succeeded", actor=actor, evidence=evidence, attributes=searchable(result, search_fields)):
        raise LeaseLost(record.pk)
    return record


def mark_failed(record: IdempotencyRecord, failure: ToolFailure, *, actor: str,
                retry_window: timedelta | None = None) -> IdempotencyRecord:
    """PROCESSING -> FAILED, by the lease holder; a transient failure may be reclaimed later.

    `failure` is `backed_off` already, so the agent hears the retry_after stored here. A retryable
    failure is a known non-execution (nothing was done): the first one of the key opens its retry
    window (`retry_until`, `retry_window` from now, IDEMOPS_RETRY_WINDOW_SECONDS by default), which
    bounds them instead of the per-key cap (`close_retry_window`).
    """
    retry_not_before = clock.later(failure.retry_after) \
        if failure.retryable and failure.retry_after is not None else None
    window = {"retry_until": Coalesce(F("retry_until"), clock.later(retry_window or default_retry_window()))} \
        if failure.retryable else {}
    if not _transition(record, {"status": RecordStatus.PROCESSING, "lease_owner": record.lease_owner}, {
        "status": RecordStatus.FAILED, "error_class": failure.error_class, "error_message": failure.message,
        "retry_not_before": retry_not_before, "lease_owner": "", "lease_expires_at": None, **window, **_finished(),
    }, action="record.failed", actor=actor, reason=failure.message, evidence=failure.evidence):
        record.refresh_from_db()
    return record


def default_retry_window() -> timedelta:
    return timedelta(seconds=conf().retry_window_seconds)


def close_retry_window(record: IdempotencyRecord, *, actor: str) -> bool:
    """FAILED(transient or rate_limited) -> FAILED(not_executed), final, once its retry window has
    passed: every run of the key was refused before the downstream acted, so nothing was done, and
    nobody needs to decide anything. Guarded by the attempt count, as a reclaim is: of a retry
    that reclaims and one that closes, one wins."""
    last = f"{record.error_class}: {record.error_message}"
    failure = NotExecuted(
        f"nothing was done: the downstream system refused every run of this key until its retry window ended at "
        f"{record.retry_until.isoformat() if record.retry_until else 'now'} (the last: {last}"[:1900]
        + "). This operation is closed; if it is still wanted, start a new operation with a new key")
    return _transition(record, {
        "status": RecordStatus.FAILED, "error_class__in": sorted(map(str, RETRYABLE)), "attempts": record.attempts,
    }, {
        "status": RecordStatus.FAILED, "error_class": failure.error_class, "error_message": failure.message,
        "retry_not_before": None, **_finished(),
    }, action="record.not_executed", actor=actor, reason="retry window ended; nothing was done",
        before={"status": record.status, "error_class": record.error_class},
        evidence=evidence_entry("engine", note=f"retry window ended after {record.attempts} runs, each refused "
                                               f"before the downstream acted"))


def retry_window_closed(record: IdempotencyRecord) -> bool:
    """A retryable failure whose retry window has passed (by the database's time of the read)."""
    return record.retry_until is not None and record.retry_until <= clock.read_at(record)


def backed_off(failure: ToolFailure, attempts: int) -> ToolFailure:
    """A transient failure without a `retry_after` of its own (a downstream's Retry-After) gets
    the shared backoff for its `attempts`-th run."""
    if failure.retryable and failure.retry_after is None:
        return failure.replaced(retry_after=write_retry_after(attempts))
    return failure


def write_retry_after(attempts: int) -> float:
    """Seconds before a write whose `attempts`-th run failed transiently may run again."""
    return backoff.delay(attempts, base=WRITE_RETRY_BASE_SECONDS, ceiling=WRITE_RETRY_MAX_SECONDS)


def mark_unknown(record: IdempotencyRecord, unknown: UnknownOutcome, *, actor: str) -> IdempotencyRecord:
    """PROCESSING -> UNKNOWN, by the lease holder, when the downstream outcome is unknowable here."""
    if not _transition(record, {"status": RecordStatus.PROCESSING, "lease_owner": record.lease_owner}, {
        "status": RecordStatus.UNKNOWN, "error_class": unknown.error_class, "error_message": unknown.message,
        "lease_owner": "", "lease_expires_at": None, "next_reconcile_at": clock.NOW,
        "uncertain_runs": record.uncertain_runs + 1,
    }, action="record.unknown", actor=actor, reason=unknown.message,
            evidence=unknown.evidence or evidence_entry("executor", note=unknown.message)):
        record.refresh_from_db()
    return record


def escalate_retries(record: IdempotencyRecord, *, actor: str, cap: int) -> bool:
    """FAILED(transient or rate_limited) -> UNKNOWN, flagged for a person, instead of a reclaim once
    `cap` runs of the key had an uncertain or unexpected outcome (IDEMOPS_MAX_ATTEMPTS_PER_KEY: a
    timeout after sending, an internal error, a lost lease, each found not done afterwards). Runs the
    downstream refused before acting never count: the retry window bounds those.

    The UNKNOWN queue is where operators already settle what the engine cannot: not retried by
    the reconciler (escalated), and callers hear `unknown_outcome` meanwhile. Guarded by the
    attempt count, as a reclaim is.
    """
    last = f"{record.error_class}: {record.error_message}"
    return _transition(record, {
        "status": RecordStatus.FAILED, "error_class__in": sorted(map(str, RETRYABLE)), "attempts": record.attempts,
    }, {
        "status": RecordStatus.UNKNOWN, "error_class": "unknown_outcome",
        "error_message": f"gave up after {record.uncertain_runs} runs of this key with an uncertain outcome, "
                         f"{record.attempts} in all (the last failed with {last})"[:2000],
        "retry_not_before": None, "finished_at": None, "next_reconcile_at": None, "escalated_at": clock.NOW,
    }, action="record.escalated", actor=actor, reason=f"uncertain runs per key reached {cap}; a person must decide",
        evidence=evidence_entry("engine", note=f"{record.uncertain_runs} uncertain runs; the last: {last}"[:2000]))


def retire(record: IdempotencyRecord, *, actor: str, reason: str = "retention ended; key reused") -> bool:
    """Free an expired finished record's key; the row stays for auditors."""
    return _transition(record, {"retired_at__isnull": True, "status__in": FINISHED, "ongoing": False,
                                "expires_at__lte": clock.NOW},
                       {"retired_at": clock.NOW}, action="record.retired", actor=actor, reason=reason)


def hold_while_ongoing(record: IdempotencyRecord, *, actor: str, reason: str) -> bool:
    """The operation `record` stands for goes on after its call answers (it started a long task):
    until `retain_from_end`, its key cannot expire, be retired, released or purged, whatever the
    record's age. Call in the transaction that starts (or restarts) what goes on."""
    return _transition(record, {"retired_at__isnull": True, "ongoing": False}, {"ongoing": True},
                       action="record.held_while_ongoing", actor=actor, reason=reason,
                       before={"ongoing": False}, after={"ongoing": True})


def retain_from_end(record: IdempotencyRecord, retention: timedelta, *, actor: str, reason: str) -> bool:
    """What `record` started has ended: its key's retention (`retention`) counts from now. Call in
    the transaction of the end, so no moment exists where the operation ended but the key is held
    forever, or where it is unfinished but the key may expire (or put `retention_from_end_with`'s
    writes in the end's own statement)."""
    return _transition(record, {"ongoing": True}, {"ongoing": False, "expires_at": clock.later(retention)},
                       action=RETAINED_FROM_END, actor=actor, reason=reason,
                       before={"ongoing": True}, after=_retained_after(retention))


def retention_from_end_with(record: IdempotencyRecord, retention: timedelta, *, actor: str,
                            reason: str) -> db.AlsoMoving:
    """`retain_from_end` as writes of the statement that ends what `record` started (core.db.also_moving):
    the record's move and its audit event commit with the end, only if the end moved, or not at all."""
    return db.also_moving(record, {"ongoing": True},
                          {"ongoing": False, "expires_at": clock.later(retention), "updated_at": clock.NOW},
                          name="retained", action=RETAINED_FROM_END, actor=actor, reason=reason,
                          trace_id=record.trace_id, before={"ongoing": True}, after=_retained_after(retention))


RETAINED_FROM_END = "record.retention_from_end"


def _retained_after(retention: timedelta) -> dict[str, Any]:
    return {"ongoing": False, "retention_seconds": retention.total_seconds()}


def expire_lease(record: IdempotencyRecord, *, actor: str = LEASE_SWEEPER, source: str = "sweep",
                 now: datetime | None = None) -> bool:
    """PROCESSING -> UNKNOWN: the executor's lease ran out (it died, hung, or lost its database).

    Never re-executes: a dead executor may have done its side effect; the
    record is due for reconciliation at once. Guarded by the expired lease
    itself: an executor that renewed in time keeps the record. Taken by the
    sweep, and by a follower that finds the lease expired (`source` says which). `now` (a
    test's) replaces the database's time in the guard.
    """
    guard_now: datetime | Expression = now or clock.NOW
    expired = _transition(
        record, {"status": RecordStatus.PROCESSING, "lease_owner": record.lease_owner,
                 "lease_expires_at__lt": guard_now},
        {"status": RecordStatus.UNKNOWN, "error_class": "unknown_outcome",
         "error_message": "the executor's lease expired before it recorded an outcome",
         "lease_owner": "", "lease_expires_at": None, "next_reconcile_at": guard_now,
         "uncertain_runs": F("uncertain_runs") + 1},
        action="record.unknown", actor=actor, reason="lease expired",
        evidence=evidence_entry(source, note=f"lease of {record.lease_owner} expired"))
    if expired:
        counters.count(counters.PROCESSING_TIMEOUT, tool=record.tool, tenant_id=record.tenant_id)
        logs.get(__name__).warning("record.lease_expired", tool=record.tool, tenant_id=record.tenant_id,
                                   record_id=record.pk, operation_id=str(record.operation_id), taken_by=source)
    return expired


def expire_leases() -> list[IdempotencyRecord]:
    """The sweep: `expire_lease` for every record whose executor's lease ran out."""
    stale = IdempotencyRecord.objects.filter(status=RecordStatus.PROCESSING, lease_expires_at__lt=clock.NOW)
    return [record for record in stale if expire_lease(record)]


def resolve_succeeded(record: IdempotencyRecord, result: dict[str, Any], *, actor: str, reason: str,
                      evidence: dict[str, Any], search_fields: frozenset[str] = frozenset()) -> bool:
    """UNKNOWN -> SUCCEEDED: the downstream did it; store its result so a replay returns it (and its
    `search_fields` in the record's attributes)."""
    return _transition(record, {"status": RecordStatus.UNKNOWN}, {
        "status": RecordStatus.SUCCEEDED, "result": _sealing(record, result), "error_class": "", "error_message": "",
        "next_reconcile_at": None, **_finished(),
    }, action="record.reconciled", actor=actor, reason=reason, evidence=evidence,
        attributes=searchable(result, search_fields))


def resolve_failed(record: IdempotencyRecord, failure: ToolFailure, *, actor: str, reason: str,
                   evidence: dict[str, Any], fresh_attempts: bool = False) -> bool:
    """UNKNOWN -> FAILED: definitely not done. A transient failure lets the same key run again;
    `fresh_attempts` (a person's decision) gives it a new budget of IDEMOPS_MAX_ATTEMPTS_PER_KEY runs."""
    return _transition(record, {"status": RecordStatus.UNKNOWN}, {
        "status": RecordStatus.FAILED, "error_class": failure.error_class, "error_message": failure.message,
        "retry_not_before": clock.NOW if failure.retryable else None, "next_reconcile_at": None, **_finished(),
        **({"attempts": 0, "uncertain_runs": 0, "retry_until": None} if fresh_attempts else {}),
    }, action="record.reconciled", actor=actor, reason=reason, evidence=evidence)


def note_unresolved(record: IdempotencyRecord, *, evidence: dict[str, Any], next_attempt_in: float | None,
                    actor: str) -> bool:
    """UNKNOWN stays UNKNOWN: count the attempt, due again in `next_attempt_in` seconds; with no
    next attempt, escalate to a person."""
    escalate = next_attempt_in is None
    return _transition(record, {"status": RecordStatus.UNKNOWN, "reconcile_attempts": record.reconcile_attempts}, {
        "reconcile_attempts": record.reconcile_attempts + 1,
        "next_reconcile_at": None if next_attempt_in is None else clock.later(next_attempt_in),
        **({"escalated_at": clock.NOW} if escalate else {}),
    }, action="record.escalated" if escalate else "record.reconcile_attempted", actor=actor,
        reason="automatic reconciliation gave up; a person must decide" if escalate else "", evidence=evidence)


def await_approval(record: IdempotencyRecord, *, actor: str) -> IdempotencyRecord:
    """PROCESSING -> AWAITING_APPROVAL, by the lease holder, instead of executing.

    The lease is dropped: nothing runs while a person decides, so the lease
    sweep must not take the record for a dead executor. Call inside the
    transaction that creates the ApprovalRequest.
    """
    if not _transition(record, {"status": RecordStatus.PROCESSING, "lease_owner": record.lease_owner}, {
        "status": RecordStatus.AWAITING_APPROVAL, "lease_owner": "", "lease_expires_at": None,
    }, action="record.awaiting_approval", actor=actor):
        raise LeaseLost(record.pk)
    return record


def start_approved(record: IdempotencyRecord, *, actor: str) -> bool:
    """AWAITING_APPROVAL -> PROCESSING under a new lease, once the request is approved.

    The status guard makes a second approval job, or a redelivered one, a no-op.
    """
    return _transition(record, {"status": RecordStatus.AWAITING_APPROVAL}, {
        "status": RecordStatus.PROCESSING, "lease_owner": leases.new_owner(),
        "lease_expires_at": leases.expiry(lease_seconds()),
    }, action="record.approved_execution", actor=actor)


def close_unapproved(record: IdempotencyRecord, failure: ToolFailure, *, actor: str, reason: str) -> bool:
    """AWAITING_APPROVAL -> FAILED (rejected or expired): retries with the key get `failure` again.

    Call inside the transaction that ends the ApprovalRequest.
    """
    return _transition(record, {"status": RecordStatus.AWAITING_APPROVAL}, {
        "status": RecordStatus.FAILED, "error_class": failure.error_class, "error_message": failure.message,
        "retry_not_before": None, **_finished(),
    }, action="record.failed", actor=actor, reason=reason)


def is_expired(record: IdempotencyRecord, now: datetime | None = None) -> bool:
    """Finished, not `ongoing`, and past its retention, by the database's time of the read (or `now`)."""
    return (record.status in FINISHED and not record.ongoing
            and record.expires_at <= (now or clock.read_at(record)))


def retention_ends_at(record: IdempotencyRecord) -> datetime | None:
    """When the key's retention ends, as callers are told it: None while the operation the record
    started goes on (`ongoing`: its end sets the time)."""
    return None if record.ongoing else record.expires_at


def lease_expired(record: IdempotencyRecord, now: datetime | None = None) -> bool:
    """PROCESSING, and its executor stopped renewing its lease in time (by the database's time of
    the read, or `now`)."""
    return (record.status == RecordStatus.PROCESSING and record.lease_expires_at is not None
            and record.lease_expires_at < (now or clock.read_at(record)))


def retry_wait(record: IdempotencyRecord) -> float:
    """Seconds until a transient failure may run again (0: now), by the database's time of the read."""
    if record.retry_not_before is None:
        return 0.0
    return (record.retry_not_before - clock.read_at(record)).total_seconds()


def end_retention(record: IdempotencyRecord, *, actor: str, reason: str) -> bool:
    """A finished record's retention ends now (an operator's force-expire): the key's expiry
    policy applies from the next call."""
    now = clock.read()
    return _transition(record, {"retired_at__isnull": True, "status__in": FINISHED, "ongoing": False,
                                "expires_at__gt": now},
                       {"expires_at": now}, action="record.force_expired", actor=actor, reason=reason,
                       before={"expires_at": record.expires_at.isoformat()}, after={"expires_at": now.isoformat()})


def release(record: IdempotencyRecord, *, actor: str, reason: str, checked: str,
            downstream_reference: str = "") -> bool:
    """A key held past its retention is freed (an operator checked downstream): the record is
    retired as `retire` does, with what was checked as evidence and in the audit event."""
    now = clock.read()
    facts = {"checked": checked, "downstream_reference": downstream_reference}
    return _transition(record, {"retired_at__isnull": True, "status__in": FINISHED, "ongoing": False,
                                "expires_at__lte": now},
                       {"retired_at": now}, action="record.released", actor=actor, reason=reason,
                       evidence=evidence_entry("operator", actor=actor, reason=reason, **facts),
                       before={"status": record.status, "expires_at": record.expires_at.isoformat()},
                       after={"retired_at": now.isoformat(), **facts})
