"""The idempotency engine.

A write tool call is an *operation* identified by (tenant, tool, key). The
engine guarantees that its side effect commits once and that every retry
gets the first call's result:

1. Claim: ONE atomic `INSERT ... ON CONFLICT DO NOTHING` against the partial
   unique constraint on (tenant, tool, key). The caller whose row went in is
   the executor; every other caller is a follower. Never check-then-insert.
2. Execute: the executor runs the side effect and marks the record SUCCEEDED
   in the same transaction (local effects), or FAILED with an error class.
3. Follow: a follower with the same fingerprint replays the stored result,
   waits a bounded time for an executor still working, or is told what to do
   (`in_progress`, `unknown_outcome`, `transient` + retry_after); a follower
   with other arguments gets `conflict` naming the differing fields.

The executor holds a short lease on the record (EXECUTION_LEASE_SECONDS),
renewed by a heartbeat while its handler runs (tools_app.leases). If it dies,
the lease runs out within seconds, and the first follower that finds it
expired moves the record on itself (`expire_lease`, the sweep's transition),
so nobody waits for a periodic job to learn the real state.

Every state change is one function below: a conditional UPDATE guarded by
the status (and lease owner) it expects, plus its audit event, in one
transaction.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import json
import logging
import re
import time
import unicodedata
import uuid
from collections.abc import Callable, Mapping
from contextlib import nullcontext
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from functools import cached_property
from typing import Any

from django.conf import settings
from django.db import DataError, connection, transaction
from django.utils import timezone

from tools_app import audit, db, leases, redaction, tenants
from tools_app.crashpoints import crash_point
from tools_app.errors import (
    UNKNOWN_OUTCOME_ADVICE,
    Conflict,
    Expired,
    InProgress,
    InvalidInput,
    ToolFailure,
    Transient,
    UnknownOutcome,
    invalid_data,
)
from tools_app.models import AuditEvent, IdempotencyRecord, RecordStatus

logger = logging.getLogger(__name__)

KEY_PATTERN = re.compile(r"[A-Za-z0-9._:-]{1,255}")
KEY_RULE = "idempotency_key must be 1-255 characters from A-Z a-z 0-9 . _ : -"
META_KEY = "io.idemops/idempotency-key"
DEFAULT_RETENTION = timedelta(hours=24)
# An unexpected error inside a local transaction committed nothing: safe to
# retry, after a short pause.
INTERNAL_ERROR_RETRY_AFTER = 1.0
FINISHED = (RecordStatus.SUCCEEDED, RecordStatus.FAILED)
SWEEPER = "system:lease-sweep"


class ExpiryPolicy(enum.StrEnum):
    """What a call with a key past its retention does."""

    REEXECUTE = "reexecute"  # the key is free again: run as a new operation
    HOLD = "hold"  # answer `expired`; a person decides


class LeaseLost(Exception):
    """The record is no longer ours (the sweep declared it UNKNOWN)."""


# --- keys and fingerprints ---------------------------------------------------


def validate_key(key: Any) -> str:
    if not isinstance(key, str) or not KEY_PATTERN.fullmatch(key):
        raise InvalidInput(f"invalid idempotency_key: {KEY_RULE}")
    return key


KEY_DIGEST_LENGTH = 16


def key_digest_secret() -> bytes:
    return settings.IDEMOPS["KEY_DIGEST_SECRET"].encode()


def keyed_hash(message: str) -> str:
    """HMAC-SHA256 of `message` under the server's KEY_DIGEST_SECRET, as hex.

    Keyed, not a plain hash: keys are often order numbers or e-mail addresses,
    and a plain SHA-256 of those falls to a dictionary in seconds.
    """
    return hmac.new(key_digest_secret(), message.encode(), hashlib.sha256).hexdigest()


def key_digest(key: str) -> str:
    """How a key appears outside the database (admin, auditors' API, logs): never raw."""
    return keyed_hash(key)[:KEY_DIGEST_LENGTH]


def canonical_json(value: Any) -> str:
    """JSON with sorted keys, NFC strings and normalized numbers (1 == 1.0 == 1.00)."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, (int, float, Decimal)):
        return _canonical_number(value)
    if isinstance(value, str):
        return json.dumps(unicodedata.normalize("NFC", value), ensure_ascii=False)
    if isinstance(value, Mapping):
        items = sorted((unicodedata.normalize("NFC", str(k)), v) for k, v in value.items())
        return "{" + ",".join(f"{json.dumps(k, ensure_ascii=False)}:{canonical_json(v)}" for k, v in items) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(canonical_json(v) for v in value) + "]"
    if isinstance(value, datetime):
        value = value.astimezone(UTC) if value.tzinfo else value
        return json.dumps(value.isoformat())
    if isinstance(value, (date, uuid.UUID)):
        return json.dumps(str(value))
    raise TypeError(f"cannot fingerprint a {type(value).__name__}")


def _canonical_number(value: int | float | Decimal) -> str:
    number = Decimal(str(value)) if isinstance(value, float) else Decimal(value)
    if not number.is_finite():
        raise InvalidInput("numbers must be finite")
    if number == 0:
        return "0"
    return format(number.normalize(), "f")


def digest(value: Any) -> str:
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()


# --- the operation -------------------------------------------------------------


@dataclass(frozen=True)
class Operation:
    """A write call as the engine sees it: who, which tool, which key, what arguments."""

    tenant_id: int
    tool: str
    key: str
    arguments: dict[str, Any]  # business arguments only: what the fingerprint covers
    actor: str = ""
    trace_id: str = ""
    retention: timedelta = DEFAULT_RETENTION
    on_expiry: ExpiryPolicy = ExpiryPolicy.REEXECUTE
    # True: the side effect is local and commits with the record (a crash
    # leaves nothing). False: it happens elsewhere (a downstream call), so
    # the engine holds no transaction across it and an interrupted call ends
    # UNKNOWN, to be reconciled.
    transactional: bool = True
    # Consulted before every execution of a sensitive tool (tools_app.approvals.gate):
    # an Outcome diverts the call to a person's approval, None lets it run.
    approval: Callable[[IdempotencyRecord], Outcome | None] | None = None

    @cached_property
    def fingerprint(self) -> str:
        return digest(self.arguments)

    @cached_property
    def field_digests(self) -> dict[str, str]:
        return {name: digest(value) for name, value in self.arguments.items()}

    def differing_fields(self, record: IdempotencyRecord) -> list[str]:
        stored = record.field_digests
        return sorted(name for name in stored.keys() | self.field_digests.keys()
                      if stored.get(name) != self.field_digests.get(name))


@dataclass
class Outcome:
    """What a call ended in: a result (first or replayed) or an error."""

    record: IdempotencyRecord
    replayed: bool = False
    error: ToolFailure | None = None
    executed: bool = False  # this call ran the side effect (or tried to)

    @property
    def result(self) -> dict[str, Any] | None:
        return None if self.error else self.record.result


# The side effect: receives the claimed record, returns the JSON result. For
# local effects it runs inside the transaction that marks the record done.
Executor = Callable[[IdempotencyRecord], dict[str, Any]]


def run(op: Operation, execute: Executor) -> Outcome:
    """Execute `op` once, or answer as a follower of whoever did."""
    # A retired key or a lost reclaim race sends us round again; twice is
    # plenty, since each round means another caller made progress.
    for _ in range(3):
        record, claimed = claim(op)
        if claimed:
            return _execute(record, op, execute)
        outcome = _follow(record, op, execute)
        if outcome is not None:
            return outcome
    raise InProgress("the operation is changing hands; ask again", retry_after=_in_progress_retry_after())


def _follow(record: IdempotencyRecord, op: Operation, execute: Executor) -> Outcome | None:
    """Answer a caller that lost the claim. None means: try to claim again."""
    if is_expired(record):
        if op.on_expiry == ExpiryPolicy.HOLD:
            return Outcome(record, error=Expired(
                f"this key's retention ended at {record.expires_at.isoformat()}; "
                "a person must check before it is used again"))
        retire(record, actor=op.actor)
        return None
    if record.fingerprint != op.fingerprint:
        fields = op.differing_fields(record)
        return Outcome(record, error=Conflict(
            f"idempotency_key was already used with other arguments (differing: {', '.join(fields)}); "
            "use a new key for a new operation",
            differing_fields=fields))
    if record.status == RecordStatus.PROCESSING:
        record = wait_for_outcome(record)
        if lease_expired(record):
            record = _take_over(record, op)
    match record.status:
        case RecordStatus.SUCCEEDED:
            return Outcome(record, replayed=True)
        case RecordStatus.PROCESSING:
            return Outcome(record, error=InProgress(
                "the first call with this key is still running; ask again with the same key",
                retry_after=_in_progress_retry_after()))
        case RecordStatus.UNKNOWN:
            return Outcome(record, error=UnknownOutcome(
                f"the outcome of the first call is unknown and is being reconciled: {UNKNOWN_OUTCOME_ADVICE}"))
        case RecordStatus.FAILED:
            return _follow_failed(record, op, execute)
        case RecordStatus.AWAITING_APPROVAL:
            from tools_app import approvals  # approvals builds on this module

            return approvals.follow(record)
    raise AssertionError(f"unhandled status {record.status}")


def _take_over(record: IdempotencyRecord, op: Operation) -> IdempotencyRecord:
    """The executor's lease ran out under a follower's eyes: the follower moves the record on
    itself, as the sweep would, and settles at once what can be settled (`on_lease_expired`)."""
    if expire_lease(record, actor=op.actor, source="follower"):
        try:
            _settle_expired(record)
        except Exception:
            # Settling now only saves a wait: the record is UNKNOWN and due, and
            # the reconciliation sweep settles it; the caller hears so.
            logger.exception("settling record %s after its lease expired failed", record.pk)
    # Also when another follower or the sweep got there first: follow what it is now.
    record.refresh_from_db()
    return record


def _follow_failed(record: IdempotencyRecord, op: Operation, execute: Executor) -> Outcome | None:
    failure = ToolFailure.from_dict({"class": record.error_class, "message": record.error_message})
    if not failure.retryable:
        return Outcome(record, replayed=True, error=failure)
    wait = (record.retry_not_before - timezone.now()).total_seconds() if record.retry_not_before else 0
    if wait > 0:
        return Outcome(record, replayed=True, error=Transient(record.error_message, retry_after=wait))
    reclaimed = reclaim(record, op)
    if reclaimed is None:
        return None  # another retry got there first; follow it
    return _execute(reclaimed, op, execute)


def _execute(record: IdempotencyRecord, op: Operation, execute: Executor) -> Outcome:
    crash_point("after_claim")
    try:
        if op.approval is not None and (held := op.approval(record)) is not None:
            return held
        gathered = _gathered.set([])
        try:
            # A local effect commits with the record, or neither does; a
            # downstream one is done before we record it (one statement).
            with transaction.atomic() if op.transactional else nullcontext():
                # The heartbeat stops before the guarded write below: a renewal
                # queued behind our own transaction's lock on the row would
                # wait for us while we wait for it. If it found the lease lost,
                # that write fails on its owner guard (LeaseLost).
                with _heartbeat(record):
                    result = execute(record)
                crash_point("after_downstream")
                record = mark_succeeded(record, result, actor=op.actor, evidence=_gathered.get())
        finally:
            _gathered.reset(gathered)
    except UnknownOutcome as unknown:
        return Outcome(mark_unknown(record, unknown, actor=op.actor), error=unknown, executed=True)
    except ToolFailure as failure:
        return Outcome(mark_failed(record, failure, actor=op.actor), error=failure, executed=True)
    except LeaseLost:
        record.refresh_from_db()
        return Outcome(record, executed=True, error=UnknownOutcome(
            f"this call overran its lease and its outcome is being reconciled: {UNKNOWN_OUTCOME_ADVICE}"))
    except Exception as exc:
        return _unexpected_error(record, op, exc)
    crash_point("after_commit")
    return Outcome(record, executed=True)


def _unexpected_error(record: IdempotencyRecord, op: Operation, exc: Exception) -> Outcome:
    logger.exception("tool %s raised; record %s, key digest %s", op.tool, record.pk, key_digest(op.key))
    if not op.transactional:
        # We cannot tell whether the downstream request went out.
        unknown = UnknownOutcome("the call failed unexpectedly after it may have reached the downstream system; "
                                 f"it is being reconciled: {UNKNOWN_OUTCOME_ADVICE}",
                                 evidence=evidence_entry("executor", error=type(exc).__name__))
        return Outcome(mark_unknown(record, unknown, actor=op.actor), error=unknown, executed=True)
    if isinstance(exc, DataError):
        # A value the database refuses (out of range, too long): running again fails the same way.
        failure = invalid_data(exc)
        return Outcome(mark_failed(record, failure, actor=op.actor), error=failure, executed=True)
    # A bug or a database error: the transaction rolled back, so nothing
    # of the side effect committed and the same key may run again.
    failure = Transient("internal error, nothing was committed; retry with the same key",
                        retry_after=INTERNAL_ERROR_RETRY_AFTER)
    return Outcome(mark_failed(record, failure, actor=op.actor), error=failure, executed=True)


def evidence_entry(source: str, **facts: Any) -> dict[str, Any]:
    """One piece of evidence: who looked (executor, reconciler, operator, sweep), when, and what they saw."""
    return {"at": timezone.now().isoformat(), "source": source, **facts}


# Evidence a handler gathers while it executes (e.g. each downstream answer),
# stored with the record when it succeeds. Failures carry their own evidence.
_gathered: ContextVar[list[dict[str, Any]] | None] = ContextVar("gathered_evidence", default=None)


def note_evidence(entry: dict[str, Any]) -> None:
    """Keep `entry` for the record being executed in this context (no-op outside one)."""
    gathered = _gathered.get()
    if gathered is not None:
        gathered.append(entry)


# --- state changes: one function each ----------------------------------------


def _lease_owner() -> str:
    return leases.new_owner()


def lease_seconds() -> float:
    return float(settings.IDEMOPS["EXECUTION_LEASE_SECONDS"])


def _lease_expiry(now: datetime) -> datetime:
    return now + timedelta(seconds=lease_seconds())


def heartbeat_interval() -> float:
    return leases.heartbeat_interval(settings.IDEMOPS["EXECUTION_HEARTBEAT_SECONDS"], lease_seconds())


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
    ).update(lease_expires_at=_lease_expiry(timezone.now())))


def _heartbeat(record: IdempotencyRecord) -> leases.Heartbeat:
    return leases.Heartbeat(lambda: renew_lease(record), heartbeat_interval(), name=f"lease-of-record-{record.pk}")


def claim(op: Operation) -> tuple[IdempotencyRecord, bool]:
    """Return (record, True) if this call inserted the PROCESSING record for
    `op` and is its executor, or (the live record, False) for a follower."""
    if row := _fetch_live(op):  # replays, the common case, stop here: one indexed read
        return db.from_row(IdempotencyRecord, row), False
    record = new_record(op)
    # The record has no id yet: the statement fills object_id from the inserted row.
    claimed_event = audit.new_event(action="record.claimed", obj=record, actor=op.actor, trace_id=op.trace_id,
                                    after={"status": RecordStatus.PROCESSING, "fingerprint": op.fingerprint})
    if row := _claim_or_fetch(record, claimed_event):
        return db.from_row(IdempotencyRecord, row[:-1]), row[-1]
    # We lost a race to a claim our statement's snapshot could not see: read it now.
    return claim(op)


def new_record(op: Operation) -> IdempotencyRecord:
    """The PROCESSING record a claim of `op` inserts (not saved)."""
    now = timezone.now()
    operation_id = uuid.uuid4()
    return IdempotencyRecord(
        tenant_id=op.tenant_id, tool=op.tool, key=op.key, fingerprint=op.fingerprint,
        # What is kept to be read: URLs lose their query (tokens); the fingerprint covers the full arguments.
        field_digests=op.field_digests, arguments=redaction.scrub_urls(json.loads(canonical_json(op.arguments))),
        status=RecordStatus.PROCESSING, attempts=1, lease_owner=_lease_owner(), lease_expires_at=_lease_expiry(now),
        operation_id=operation_id, trace_id=op.trace_id, actor=op.actor,
        downstream_key="" if op.transactional else downstream_key(operation_id),
        created_at=now, updated_at=now, expires_at=now + op.retention,
    )


def downstream_key(operation_id: uuid.UUID) -> str:
    """The key sent to a downstream system: one per operation, so every retry of it is deduplicated
    there, and a key freed after its retention (retired or released) is a new operation there too."""
    return f"idemops-{operation_id.hex}"


def _claim_or_fetch(record: IdempotencyRecord, claimed_event: AuditEvent) -> tuple | None:
    """One statement: INSERT the record and its audit event, unless a live record holds the key.

    Two first calls racing both pass the NOT EXISTS; PostgreSQL makes the
    second INSERT wait for the first to commit and then skip (ON CONFLICT DO
    NOTHING), so exactly one inserts. The loser's statement returns no row
    (its snapshot predates the winner's commit) and the caller reads again.
    The row's last column says whether this call inserted it.
    """
    columns, values, params = db.insert_parts(record)
    audit_columns, audit_values, audit_params = db.insert_parts(
        claimed_event, expressions={"object_id": "claimed.id::text"})
    _, select_list = db.select_columns(IdempotencyRecord)
    records = db.table(IdempotencyRecord)
    sql = f"""
        WITH live AS (
            SELECT {select_list} FROM {records}
            WHERE tenant_id = %s AND tool = %s AND key = %s AND retired_at IS NULL
        ), claimed AS (
            INSERT INTO {records} ({", ".join(columns)}) SELECT {", ".join(values)}
            WHERE NOT EXISTS (SELECT FROM live)
            ON CONFLICT DO NOTHING RETURNING *
        ), audited AS (
            INSERT INTO {db.table(AuditEvent)} ({", ".join(audit_columns)})
            SELECT {", ".join(audit_values)} FROM claimed
        )
        SELECT {select_list}, true FROM claimed
        UNION ALL
        SELECT *, false FROM live
    """
    with connection.cursor() as cursor:
        cursor.execute(sql, [record.tenant_id, record.tool, record.key, *params, *audit_params])
        return cursor.fetchone()


def _fetch_live(op: Operation) -> tuple | None:
    _, select_list = db.select_columns(IdempotencyRecord)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {select_list} FROM {db.table(IdempotencyRecord)} "
                       "WHERE tenant_id = %s AND tool = %s AND key = %s AND retired_at IS NULL",
                       [op.tenant_id, op.tool, op.key])
        return cursor.fetchone()


def _transition(record: IdempotencyRecord, expected: dict[str, Any], changes: dict[str, Any], *, action: str,
                actor: str, reason: str = "", evidence: dict[str, Any] | list[dict[str, Any]] | None = None,
                trace_id: str = "", before: dict[str, Any] | None = None,
                after: dict[str, Any] | None = None) -> bool:
    """The conditional UPDATE every state change goes through, with its audit event, in one statement.

    The event records the status before and after (unless told otherwise);
    `evidence`, if any, is appended to the record's evidence list.
    """
    changes = {**changes, "updated_at": timezone.now()}
    event = audit.new_event(
        action=action, obj=record, actor=actor, reason=reason, trace_id=trace_id or record.trace_id,
        before=before or {"status": record.status},
        after=after or {"status": changes.get("status", record.status),
                        **({"error_class": changes["error_class"]} if changes.get("error_class") else {})})
    entries = [evidence] if isinstance(evidence, dict) else list(evidence or [])
    if not db.conditional_update(record, expected, changes, event=event,
                                 append={"evidence": entries} if entries else None):
        return False
    for name, value in changes.items():
        setattr(record, name, value)
    record.evidence = [*record.evidence, *entries]
    return True


def _finished(record: IdempotencyRecord, now: datetime) -> dict[str, Any]:
    """Fields every move to a final status sets: retention counts from the finish."""
    return {"finished_at": now, "expires_at": now + (record.expires_at - record.created_at)}


def mark_succeeded(record: IdempotencyRecord, result: dict[str, Any], *, actor: str,
                   evidence: list[dict[str, Any]] | None = None) -> IdempotencyRecord:
    """PROCESSING -> SUCCEEDED, by the lease holder. Call inside the business transaction."""
    if not _transition(record, {"status": RecordStatus.PROCESSING, "lease_owner": record.lease_owner}, {
        "status": RecordStatus.SUCCEEDED, "result": result, "lease_owner": "", "lease_expires_at": None,
        "error_class": "", "error_message": "", **_finished(record, timezone.now()),
    }, action="record.succeeded", actor=actor, evidence=evidence):
        raise LeaseLost(record.pk)
    return record


def mark_failed(record: IdempotencyRecord, failure: ToolFailure, *, actor: str) -> IdempotencyRecord:
    """PROCESSING -> FAILED, by the lease holder; a transient failure may be reclaimed later."""
    now = timezone.now()
    retry_not_before = now + timedelta(seconds=failure.retry_after or 0) if failure.retryable else None
    if not _transition(record, {"status": RecordStatus.PROCESSING, "lease_owner": record.lease_owner}, {
        "status": RecordStatus.FAILED, "error_class": failure.error_class, "error_message": failure.message,
        "retry_not_before": retry_not_before, "lease_owner": "", "lease_expires_at": None, **_finished(record, now),
    }, action="record.failed", actor=actor, reason=failure.message, evidence=failure.evidence):
        record.refresh_from_db()
    return record


def mark_unknown(record: IdempotencyRecord, unknown: UnknownOutcome, *, actor: str) -> IdempotencyRecord:
    """PROCESSING -> UNKNOWN, by the lease holder, when the downstream outcome is unknowable here."""
    if not _transition(record, {"status": RecordStatus.PROCESSING, "lease_owner": record.lease_owner}, {
        "status": RecordStatus.UNKNOWN, "error_class": unknown.error_class, "error_message": unknown.message,
        "lease_owner": "", "lease_expires_at": None, "next_reconcile_at": timezone.now(),
    }, action="record.unknown", actor=actor, reason=unknown.message,
            evidence=unknown.evidence or evidence_entry("executor", note=unknown.message)):
        record.refresh_from_db()
    return record


def reclaim(record: IdempotencyRecord, op: Operation) -> IdempotencyRecord | None:
    """FAILED(transient) -> PROCESSING for a retry with the same key and arguments.

    Guarded by the attempt count we saw, so of several racing retries one wins.
    """
    if not _transition(record, {
        "status": RecordStatus.FAILED, "error_class": "transient", "fingerprint": op.fingerprint,
        "attempts": record.attempts,
    }, {
        "status": RecordStatus.PROCESSING, "attempts": record.attempts + 1, "lease_owner": _lease_owner(),
        "lease_expires_at": _lease_expiry(timezone.now()), "error_class": "", "error_message": "",
        "retry_not_before": None, "finished_at": None, "trace_id": op.trace_id or record.trace_id,
    }, action="record.reclaimed", actor=op.actor):
        return None
    return record


def retire(record: IdempotencyRecord, *, actor: str, reason: str = "retention ended; key reused") -> bool:
    """Free an expired finished record's key; the row stays for auditors."""
    now = timezone.now()
    return _transition(record, {"retired_at__isnull": True, "status__in": FINISHED, "expires_at__lte": now},
                       {"retired_at": now}, action="record.retired", actor=actor, reason=reason)


def expire_lease(record: IdempotencyRecord, *, actor: str = SWEEPER, source: str = "sweep",
                 now: datetime | None = None) -> bool:
    """PROCESSING -> UNKNOWN: the executor's lease ran out (it died, hung, or lost its database).

    Never re-executes: a dead executor may have done its side effect; the
    record is due for reconciliation at once. Guarded by the expired lease
    itself: an executor that renewed in time keeps the record. Taken by the
    sweep, and by a follower that finds the lease expired (`source` says which).
    """
    now = now or timezone.now()
    return _transition(
        record, {"status": RecordStatus.PROCESSING, "lease_owner": record.lease_owner, "lease_expires_at__lt": now},
        {"status": RecordStatus.UNKNOWN, "error_class": "unknown_outcome",
         "error_message": "the executor's lease expired before it recorded an outcome",
         "lease_owner": "", "lease_expires_at": None, "next_reconcile_at": now},
        action="record.unknown", actor=actor, reason="lease expired",
        evidence=evidence_entry(source, note=f"lease of {record.lease_owner} expired"))


def expire_leases(now: datetime | None = None) -> list[IdempotencyRecord]:
    """The sweep: `expire_lease` for every record whose executor's lease ran out."""
    now = now or timezone.now()
    stale = IdempotencyRecord.objects.filter(status=RecordStatus.PROCESSING, lease_expires_at__lt=now)
    return [record for record in stale if expire_lease(record, now=now)]


def _left_to_the_sweep(record: IdempotencyRecord) -> None:
    """Until a settler is registered, an expired record waits for the reconciliation sweep."""


# How a record a follower just took from a dead executor is settled at once
# where that is possible: tools_app.reconciliation registers it (it builds on
# this module, so this one cannot import it).
_settle_expired: Callable[[IdempotencyRecord], None] = _left_to_the_sweep


def on_lease_expired(settle: Callable[[IdempotencyRecord], None]) -> None:
    global _settle_expired
    _settle_expired = settle


def resolve_succeeded(record: IdempotencyRecord, result: dict[str, Any], *, actor: str, reason: str,
                      evidence: dict[str, Any]) -> bool:
    """UNKNOWN -> SUCCEEDED: the downstream did it; store its result so a replay returns it."""
    return _transition(record, {"status": RecordStatus.UNKNOWN}, {
        "status": RecordStatus.SUCCEEDED, "result": result, "error_class": "", "error_message": "",
        "next_reconcile_at": None, **_finished(record, timezone.now()),
    }, action="record.reconciled", actor=actor, reason=reason, evidence=evidence)


def resolve_failed(record: IdempotencyRecord, failure: ToolFailure, *, actor: str, reason: str,
                   evidence: dict[str, Any]) -> bool:
    """UNKNOWN -> FAILED: definitely not done. A transient failure lets the same key run again."""
    now = timezone.now()
    return _transition(record, {"status": RecordStatus.UNKNOWN}, {
        "status": RecordStatus.FAILED, "error_class": failure.error_class, "error_message": failure.message,
        "retry_not_before": now if failure.retryable else None, "next_reconcile_at": None, **_finished(record, now),
    }, action="record.reconciled", actor=actor, reason=reason, evidence=evidence)


def note_unresolved(record: IdempotencyRecord, *, evidence: dict[str, Any], next_attempt_at: datetime | None,
                    actor: str) -> bool:
    """UNKNOWN stays UNKNOWN: count the attempt; with no next attempt, escalate to a person."""
    escalate = next_attempt_at is None
    return _transition(record, {"status": RecordStatus.UNKNOWN, "reconcile_attempts": record.reconcile_attempts}, {
        "reconcile_attempts": record.reconcile_attempts + 1, "next_reconcile_at": next_attempt_at,
        **({"escalated_at": timezone.now()} if escalate else {}),
    }, action="record.escalated" if escalate else "record.reconcile_attempted", actor=actor,
        reason="automatic reconciliation gave up; a person must decide" if escalate else "", evidence=evidence)


# --- approval (tools_app.approvals decides; these move the record) ---------------


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
        "status": RecordStatus.PROCESSING, "lease_owner": _lease_owner(),
        "lease_expires_at": _lease_expiry(timezone.now()),
    }, action="record.approved_execution", actor=actor)


def execute_approved(record: IdempotencyRecord, op: Operation, execute: Executor) -> Outcome | None:
    """Run an approved operation as its executor; None if the record had already left AWAITING_APPROVAL."""
    if not start_approved(record, actor=op.actor):
        return None
    return _execute(record, op, execute)


def close_unapproved(record: IdempotencyRecord, failure: ToolFailure, *, actor: str, reason: str) -> bool:
    """AWAITING_APPROVAL -> FAILED (rejected or expired): retries with the key get `failure` again.

    Call inside the transaction that ends the ApprovalRequest.
    """
    return _transition(record, {"status": RecordStatus.AWAITING_APPROVAL}, {
        "status": RecordStatus.FAILED, "error_class": failure.error_class, "error_message": failure.message,
        "retry_not_before": None, **_finished(record, timezone.now()),
    }, action="record.failed", actor=actor, reason=reason)


# --- operators (each checks its Permit first: tools_app.tenants.authorize) -------------

FORCE_EXPIRE = tenants.Permit("tools_app.force_expire_idempotencyrecord", "force_expire",
                              "force-expire idempotency keys", "record.force_expire_refused")
RELEASE_HELD_KEY = tenants.Permit("tools_app.release_held_key", "release_held_key",
                                  "release held idempotency keys", "record.release_refused")


def force_expire(record: IdempotencyRecord, user, *, reason: str) -> bool:
    """An operator ends a finished record's retention now: the key's expiry policy applies from the next call."""
    actor = tenants.authorize(user, FORCE_EXPIRE, record)
    if not reason.strip():
        raise InvalidInput("force-expiring a key needs a reason")
    now = timezone.now()
    return _transition(record, {"retired_at__isnull": True, "status__in": FINISHED, "expires_at__gt": now},
                       {"expires_at": now}, action="record.force_expired", actor=actor, reason=reason,
                       before={"expires_at": record.expires_at.isoformat()}, after={"expires_at": now.isoformat()})


def release_held_key(record: IdempotencyRecord, user, *, reason: str, checked: str,
                     downstream_reference: str = "") -> bool:
    """An operator frees a key held past its retention (ExpiryPolicy.HOLD), after checking downstream.

    The record is retired as `retire` does: its row stays for auditors, and
    the next call with the key runs as a new operation (with a new
    downstream key, so the downstream system does not answer it with the old
    effect). What the operator checked is kept as evidence on the record and
    in the audit event.
    """
    actor = tenants.authorize(user, RELEASE_HELD_KEY, record)
    if not reason.strip() or not checked.strip():
        raise InvalidInput("releasing a held key needs a reason and what you checked downstream "
                           "(e.g. the payment id found, or 'no payment at the gateway for this key')")
    now = timezone.now()
    facts = {"checked": checked, "downstream_reference": downstream_reference}
    return _transition(record, {"retired_at__isnull": True, "status__in": FINISHED, "expires_at__lte": now},
                       {"retired_at": now}, action="record.released", actor=actor, reason=reason,
                       evidence=evidence_entry("operator", actor=actor, reason=reason, **facts),
                       before={"status": record.status, "expires_at": record.expires_at.isoformat()},
                       after={"retired_at": now.isoformat(), **facts})


# --- reading ------------------------------------------------------------------


def is_expired(record: IdempotencyRecord, now: datetime | None = None) -> bool:
    return record.status in FINISHED and record.expires_at <= (now or timezone.now())


def lease_expired(record: IdempotencyRecord, now: datetime | None = None) -> bool:
    """PROCESSING, and its executor stopped renewing its lease in time."""
    return (record.status == RecordStatus.PROCESSING and record.lease_expires_at is not None
            and record.lease_expires_at < (now or timezone.now()))


def wait_for_outcome(record: IdempotencyRecord) -> IdempotencyRecord:
    """Poll a PROCESSING record until it finishes, its lease runs out, or the follower wait runs out."""
    deadline = time.monotonic() + settings.IDEMOPS["FOLLOWER_WAIT_SECONDS"]
    pause = 0.01
    while (record.status == RecordStatus.PROCESSING and not lease_expired(record)
           and time.monotonic() < deadline):
        time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
        pause = min(pause * 2, 0.2)
        record.refresh_from_db()
    return record


def _in_progress_retry_after() -> float:
    return float(settings.IDEMOPS["IN_PROGRESS_RETRY_AFTER_SECONDS"])
