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

Every state change is one function below: a conditional UPDATE guarded by
the status (and lease owner) it expects, plus its audit event, in one
transaction.
"""

from __future__ import annotations

import enum
import hashlib
import json
import logging
import os
import re
import socket
import time
import unicodedata
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from functools import cached_property
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from tools_app import audit
from tools_app.errors import (
    Conflict,
    Expired,
    InProgress,
    InvalidInput,
    ToolFailure,
    Transient,
    UnknownOutcome,
)
from tools_app.models import IdempotencyRecord, RecordStatus

logger = logging.getLogger(__name__)

KEY_PATTERN = re.compile(r"[A-Za-z0-9._:-]{1,255}")
KEY_RULE = "idempotency_key must be 1-255 characters from A-Z a-z 0-9 . _ : -"
META_KEY = "io.idemops/idempotency-key"
DEFAULT_RETENTION = timedelta(hours=24)
# An unexpected error inside a local transaction committed nothing: safe to
# retry, after a short pause.
INTERNAL_ERROR_RETRY_AFTER = 1.0
FINISHED = (RecordStatus.SUCCEEDED, RecordStatus.FAILED)


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


def key_digest(key: str) -> str:
    """How a key appears outside the database (logs, exports): never raw."""
    return hashlib.sha256(key.encode()).hexdigest()[:16]


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
    match record.status:
        case RecordStatus.SUCCEEDED:
            return Outcome(record, replayed=True)
        case RecordStatus.PROCESSING:
            return Outcome(record, error=InProgress(
                "the first call with this key is still running; ask again with the same key",
                retry_after=_in_progress_retry_after()))
        case RecordStatus.UNKNOWN:
            return Outcome(record, error=UnknownOutcome(
                "the outcome of the first call is unknown and is being reconciled; do not retry "
                "with a new key, ask again later with the same key"))
        case RecordStatus.FAILED:
            return _follow_failed(record, op, execute)
        case RecordStatus.AWAITING_APPROVAL:
            from tools_app import approvals  # approvals builds on this module

            return approvals.follow(record)
    raise AssertionError(f"unhandled status {record.status}")


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
    try:
        if op.approval is not None and (held := op.approval(record)) is not None:
            return held
        with transaction.atomic():
            result = execute(record)
            record = mark_succeeded(record, result, actor=op.actor)
    except ToolFailure as failure:
        return Outcome(mark_failed(record, failure, actor=op.actor), error=failure)
    except LeaseLost:
        record.refresh_from_db()
        return Outcome(record, error=UnknownOutcome(
            "this call overran its lease and its outcome is being reconciled; do not retry with a new key"))
    except Exception:
        # A bug or a database error: the transaction rolled back, so nothing
        # of the side effect committed and the same key may run again.
        logger.exception("tool %s raised; record %s marked transient", op.tool, record.pk)
        failure = Transient("internal error, nothing was committed; retry with the same key",
                            retry_after=INTERNAL_ERROR_RETRY_AFTER)
        return Outcome(mark_failed(record, failure, actor=op.actor), error=failure)
    return Outcome(record)


# --- state changes: one function each ----------------------------------------


def _lease_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def _lease_expiry(now: datetime) -> datetime:
    return now + timedelta(seconds=settings.IDEMOPS["EXECUTION_LEASE_SECONDS"])


def claim(op: Operation) -> tuple[IdempotencyRecord, bool]:
    """Insert a PROCESSING record for `op`, or fetch the live one holding its key.

    Returns (record, True) for the executor and (record, False) for a follower.
    """
    now = timezone.now()
    record = IdempotencyRecord(
        tenant_id=op.tenant_id, tool=op.tool, key=op.key, fingerprint=op.fingerprint,
        field_digests=op.field_digests, arguments=json.loads(canonical_json(op.arguments)),
        status=RecordStatus.PROCESSING, attempts=1, lease_owner=_lease_owner(), lease_expires_at=_lease_expiry(now),
        operation_id=uuid.uuid4(), trace_id=op.trace_id, actor=op.actor,
        created_at=now, updated_at=now, expires_at=now + op.retention,
    )
    with transaction.atomic():
        if _insert_unless_key_taken(record):
            audit.record_event(action="record.claimed", obj=record, actor=op.actor, trace_id=op.trace_id,
                               after={"status": record.status, "fingerprint": record.fingerprint})
            return record, True
    live = IdempotencyRecord.objects.filter(
        tenant_id=op.tenant_id, tool=op.tool, key=op.key, retired_at__isnull=True).first()
    if live is None:  # retired between our INSERT and this read: claim again
        return claim(op)
    return live, False


def _insert_unless_key_taken(record: IdempotencyRecord) -> bool:
    """INSERT the row; if the unique constraint already holds its key, insert nothing.

    One statement, so two racing claims cannot both win: PostgreSQL makes the
    second INSERT wait for the first to commit, then skip.
    """
    fields = [f for f in record._meta.concrete_fields if not f.primary_key]
    columns = ", ".join(connection.ops.quote_name(f.column) for f in fields)
    params = [f.get_db_prep_save(getattr(record, f.attname), connection) for f in fields]
    sql = (f"INSERT INTO {connection.ops.quote_name(record._meta.db_table)} ({columns}) "
           f"VALUES ({', '.join(['%s'] * len(fields))}) ON CONFLICT DO NOTHING RETURNING id")
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    if row is None:
        return False
    record.pk = row[0]
    record._state.adding = False
    return True


def _transition(record: IdempotencyRecord, expected: dict[str, Any], changes: dict[str, Any]) -> bool:
    """The conditional UPDATE every state change goes through."""
    changes = {**changes, "updated_at": timezone.now()}
    updated = IdempotencyRecord.objects.filter(pk=record.pk, **expected).update(**changes)
    if updated:
        for name, value in changes.items():
            setattr(record, name, value)
    return bool(updated)


def mark_succeeded(record: IdempotencyRecord, result: dict[str, Any], *, actor: str) -> IdempotencyRecord:
    """PROCESSING -> SUCCEEDED, by the lease holder. Call inside the business transaction."""
    now = timezone.now()
    retention = record.expires_at - record.created_at
    if not _transition(record, {"status": RecordStatus.PROCESSING, "lease_owner": record.lease_owner}, {
        "status": RecordStatus.SUCCEEDED, "result": result, "finished_at": now, "expires_at": now + retention,
        "lease_owner": "", "lease_expires_at": None, "error_class": "", "error_message": "",
    }):
        raise LeaseLost(record.pk)
    audit.record_event(action="record.succeeded", obj=record, actor=actor, trace_id=record.trace_id,
                       before={"status": RecordStatus.PROCESSING}, after={"status": RecordStatus.SUCCEEDED})
    return record


@transaction.atomic
def mark_failed(record: IdempotencyRecord, failure: ToolFailure, *, actor: str) -> IdempotencyRecord:
    """PROCESSING -> FAILED, by the lease holder; a transient failure may be reclaimed later."""
    now = timezone.now()
    retention = record.expires_at - record.created_at
    retry_not_before = now + timedelta(seconds=failure.retry_after or 0) if failure.retryable else None
    if _transition(record, {"status": RecordStatus.PROCESSING, "lease_owner": record.lease_owner}, {
        "status": RecordStatus.FAILED, "error_class": failure.error_class, "error_message": failure.message,
        "retry_not_before": retry_not_before, "finished_at": now, "expires_at": now + retention,
        "lease_owner": "", "lease_expires_at": None,
    }):
        audit.record_event(action="record.failed", obj=record, actor=actor, trace_id=record.trace_id,
                           before={"status": RecordStatus.PROCESSING},
                           after={"status": RecordStatus.FAILED, "error_class": failure.error_class})
    else:
        record.refresh_from_db()
    return record


@transaction.atomic
def reclaim(record: IdempotencyRecord, op: Operation) -> IdempotencyRecord | None:
    """FAILED(transient) -> PROCESSING for a retry with the same key and arguments.

    Guarded by the attempt count we saw, so of several racing retries one wins.
    """
    now = timezone.now()
    if not _transition(record, {
        "status": RecordStatus.FAILED, "error_class": "transient", "fingerprint": op.fingerprint,
        "attempts": record.attempts,
    }, {
        "status": RecordStatus.PROCESSING, "attempts": record.attempts + 1, "lease_owner": _lease_owner(),
        "lease_expires_at": _lease_expiry(now), "error_class": "", "error_message": "", "retry_not_before": None,
        "finished_at": None, "trace_id": op.trace_id or record.trace_id,
    }):
        return None
    audit.record_event(action="record.reclaimed", obj=record, actor=op.actor, trace_id=op.trace_id,
                       before={"status": RecordStatus.FAILED}, after={"status": RecordStatus.PROCESSING,
                                                                     "attempts": record.attempts})
    return record


@transaction.atomic
def retire(record: IdempotencyRecord, *, actor: str, reason: str = "retention ended; key reused") -> bool:
    """Free an expired finished record's key; the row stays for auditors."""
    now = timezone.now()
    if not _transition(record, {"retired_at__isnull": True, "status__in": FINISHED, "expires_at__lte": now},
                       {"retired_at": now}):
        return False
    audit.record_event(action="record.retired", obj=record, actor=actor, reason=reason)
    return True


# --- approval (tools_app.approvals decides; these move the record) ---------------


@transaction.atomic
def await_approval(record: IdempotencyRecord, *, actor: str) -> IdempotencyRecord:
    """PROCESSING -> AWAITING_APPROVAL, by the lease holder, instead of executing.

    The lease is dropped: nothing runs while a person decides, so the lease
    sweep must not take the record for a dead executor. Call inside the
    transaction that creates the ApprovalRequest.
    """
    if not _transition(record, {"status": RecordStatus.PROCESSING, "lease_owner": record.lease_owner}, {
        "status": RecordStatus.AWAITING_APPROVAL, "lease_owner": "", "lease_expires_at": None,
    }):
        raise LeaseLost(record.pk)
    audit.record_event(action="record.awaiting_approval", obj=record, actor=actor, trace_id=record.trace_id,
                       before={"status": RecordStatus.PROCESSING}, after={"status": RecordStatus.AWAITING_APPROVAL})
    return record


@transaction.atomic
def start_approved(record: IdempotencyRecord, *, actor: str) -> bool:
    """AWAITING_APPROVAL -> PROCESSING under a new lease, once the request is approved.

    The status guard makes a second approval job, or a redelivered one, a no-op.
    """
    if not _transition(record, {"status": RecordStatus.AWAITING_APPROVAL}, {
        "status": RecordStatus.PROCESSING, "lease_owner": _lease_owner(),
        "lease_expires_at": _lease_expiry(timezone.now()),
    }):
        return False
    audit.record_event(action="record.approved_execution", obj=record, actor=actor, trace_id=record.trace_id,
                       before={"status": RecordStatus.AWAITING_APPROVAL}, after={"status": RecordStatus.PROCESSING})
    return True


def execute_approved(record: IdempotencyRecord, op: Operation, execute: Executor) -> Outcome | None:
    """Run an approved operation as its executor; None if the record had already left AWAITING_APPROVAL."""
    if not start_approved(record, actor=op.actor):
        return None
    return _execute(record, op, execute)


@transaction.atomic
def close_unapproved(record: IdempotencyRecord, failure: ToolFailure, *, actor: str, reason: str) -> bool:
    """AWAITING_APPROVAL -> FAILED (rejected or expired): retries with the key get `failure` again.

    Call inside the transaction that ends the ApprovalRequest.
    """
    now = timezone.now()
    retention = record.expires_at - record.created_at
    if not _transition(record, {"status": RecordStatus.AWAITING_APPROVAL}, {
        "status": RecordStatus.FAILED, "error_class": failure.error_class, "error_message": failure.message,
        "retry_not_before": None, "finished_at": now, "expires_at": now + retention,
    }):
        return False
    audit.record_event(action="record.failed", obj=record, actor=actor, trace_id=record.trace_id, reason=reason,
                       before={"status": RecordStatus.AWAITING_APPROVAL},
                       after={"status": RecordStatus.FAILED, "error_class": failure.error_class})
    return True


@transaction.atomic
def force_expire(record: IdempotencyRecord, *, actor: str, reason: str, trace_id: str = "") -> bool:
    """An operator ends a finished record's retention now: the key's expiry policy applies from the next call."""
    now = timezone.now()
    before = record.expires_at
    if not _transition(record, {"retired_at__isnull": True, "status__in": FINISHED, "expires_at__gt": now},
                       {"expires_at": now}):
        return False
    audit.record_event(action="record.force_expired", obj=record, actor=actor, reason=reason,
                       trace_id=trace_id or record.trace_id,
                       before={"expires_at": before.isoformat()}, after={"expires_at": now.isoformat()})
    return True


# --- reading ------------------------------------------------------------------


def is_expired(record: IdempotencyRecord, now: datetime | None = None) -> bool:
    return record.status in FINISHED and record.expires_at <= (now or timezone.now())


def wait_for_outcome(record: IdempotencyRecord) -> IdempotencyRecord:
    """Poll a PROCESSING record until it finishes or the follower wait runs out."""
    deadline = time.monotonic() + settings.IDEMOPS["FOLLOWER_WAIT_SECONDS"]
    pause = 0.01
    while record.status == RecordStatus.PROCESSING and time.monotonic() < deadline:
        time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
        pause = min(pause * 2, 0.2)
        record.refresh_from_db()
    return record


def _in_progress_retry_after() -> float:
    return float(settings.IDEMOPS["IN_PROGRESS_RETRY_AFTER_SECONDS"])
