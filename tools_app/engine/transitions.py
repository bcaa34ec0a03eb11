"""Every change of an idempotency record: one function each.

Each is a conditional UPDATE guarded by the status (and lease owner) it expects, plus its audit
event, in one statement (`_transition`, a thin wrapper of core.db.transition); a False or None
answer means someone else moved the record first and nothing was written. The claim is one
INSERT ... ON CONFLICT DO NOTHING against the partial unique constraint on (tenant, tool, key):
never check-then-insert.

The executor holds a short lease (EXECUTION_LEASE_SECONDS), renewed by a heartbeat while its
handler runs (tools_app.core.leases); `expire_lease` is taken by the sweep and by a follower
that finds the lease expired.

Every time that decides something (lease expiries, retention, when a retry or a reconciliation
is due) is the database's (core.clock): written as `NOW`/`later()` in the statement, compared
in SQL, or compared with the database's time of the read (`read_at`, which `claim` and
`reread` set), never with this host's clock.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from functools import cache
from typing import Any

from django.db import OperationalError, connection, models, transaction
from django.db.models import Expression, F
from django.db.models.functions import Coalesce

from idemops.conf import conf
from tools_app.core import audit, backoff, clock, counters, db, keys, leases, logs, tracing
from tools_app.core.errors import RETRYABLE, NotExecuted, ToolFailure, UnknownOutcome
from tools_app.core.keys import keyed_hash
from tools_app.core.models import AuditEvent
from tools_app.engine.lookup import records_with_key
from tools_app.engine.models import IdempotencyRecord, RecordStatus
from tools_app.engine.operation import (
    ClaimWaitExpired,
    LeaseLost,
    Operation,
    evidence_entry,
    operation_id_spent,
    searchable,
    stored_form,
)

FINISHED = (RecordStatus.SUCCEEDED, RecordStatus.FAILED)


LEASE_SWEEPER = "system:lease-sweep"

# SQLSTATE of a lock wait that ran past lock_timeout.
LOCK_NOT_AVAILABLE = "55P03"

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


def claim(op: Operation) -> tuple[IdempotencyRecord, bool]:
    """Return (record, True) if this call inserted the PROCESSING record for
    `op` and is its executor, or (the live record, False) for a follower.

    For a local tool it runs inside the business transaction (engine.run): the
    claim commits with the side effect or not at all. A concurrent caller's
    INSERT then waits on the unique index for that transaction, at most
    IDEMOPS_FOLLOWER_WAIT_SECONDS (then `ClaimWaitExpired`), and reads the
    committed record once it ends. (A replay never gets here: engine.run reads first.)
    The record carries `read_at`, the database's time of the read.
    """
    with tracing.span("idempotency.claim") as span:
        record, claimed = _claim(op)
        span.set_attribute("idemops.claimed", claimed)
        span.set_attribute("idemops.record_status", record.status)
        return record, claimed


def _claim(op: Operation, operation_id: uuid.UUID | None = None) -> tuple[IdempotencyRecord, bool]:
    record = new_record(op, operation_id)
    # The record has no id yet: the statement fills object_id from the inserted row.
    claimed_event = audit.new_event(action="record.claimed", obj=record, actor=op.actor, trace_id=op.trace_id,
                                    after={"status": RecordStatus.PROCESSING, "fingerprint": op.fingerprint})
    computed = _computed_fields(record)
    try:
        row = _claim_or_fetch(record, claimed_event, computed)
    except OperationalError as exc:
        if getattr(exc.__cause__, "sqlstate", None) == LOCK_NOT_AVAILABLE:
            raise ClaimWaitExpired(op.key) from exc
        raise
    if row is not None and row[-2]:
        # Ours: the row holds what we built, and the times the database computed for it.
        record.pk = row[0]
        record._state.adding, record._state.db = False, connection.alias
        for field, value in zip(computed, row[1:-2], strict=True):
            setattr(record, field.attname, db.converted(field, value))
        record.__dict__["read_at"] = row[-1]  # as annotate(read_at=NOW) would: not a declared attribute
        return record, True
    # A live record holds the key (committed since run() looked), or we lost a race to a claim
    # our statement's snapshot could not see: read it now.
    if live := find_live(op):
        return live, False
    if op.operation_id is not None and _operation_id_taken(op.operation_id):
        # Not a lost race: an issued id whose record was retired meanwhile (retention ended, or an
        # operator released it) conflicts with that record's operation_id and never inserts.
        raise operation_id_spent(op.operation_id)
    # It is gone already (retired, or its transaction rolled back), or the id we offered is a
    # retired record's (the key's first id, and the key was used before): offer the key's next id.
    return _claim(op, claim_operation_id(op.tenant_id, op.tool, op.key))


def reread(record: IdempotencyRecord) -> IdempotencyRecord:
    """Read the record again, with the database's time of the read (`read_at`)."""
    fresh = IdempotencyRecord.objects.annotate(read_at=clock.NOW).get(pk=record.pk)
    record.__dict__.update({f.attname: getattr(fresh, f.attname) for f in IdempotencyRecord._meta.concrete_fields},
                           read_at=fresh.read_at)
    return record


def new_record(op: Operation, operation_id: uuid.UUID | None = None) -> IdempotencyRecord:
    """The PROCESSING record a claim of `op` inserts (not saved; its times are the database's,
    computed by the INSERT), named `operation_id` (by default, its key's first: operation_id_for)."""
    operation_id = op.operation_id or operation_id or operation_id_for(op.tenant_id, op.tool, op.key, 0)
    return IdempotencyRecord(
        tenant_id=op.tenant_id, tool=op.tool, key=op.key, fingerprint=op.fingerprint,
        fingerprint_version=op.fingerprint_version, field_digests=op.field_digests,
        arguments=stored_form(op.arguments), attributes=searchable(op.arguments, op.search_fields),
        status=RecordStatus.PROCESSING, attempts=1, lease_owner=leases.new_owner(),
        lease_expires_at=leases.expiry(lease_seconds()),
        operation_id=operation_id, trace_id=op.trace_id, span_id=op.span_id, actor=op.actor,
        downstream_key="" if op.transactional else downstream_key(operation_id),
        created_at=clock.NOW, updated_at=clock.NOW, expires_at=clock.later(op.retention),
    )


def operation_id_for(tenant_id: int, tool: str, key: str, generation: int) -> uuid.UUID:
    """The id of the `generation`-th operation of a key (0: its first; one more each time the key
    is freed after its retention and used again).

    A function of the key, not a random draw: a follower whose claim gave up waiting on another
    call's uncommitted claim can name the operation it waited for (claim_operation_id) before
    anyone can read its record. Keyed (KEY_DIGEST_SECRET), so nobody without the secret can
    derive an operation's id, or the key sent downstream, from its idempotency key; and salted by
    the database's birth, so a database built again from nothing under the same secret (its
    tenant ids counting from 1 again) never presents a downstream system an earlier one's keys.
    """
    message = f"operation\n{_database_born()}\n{tenant_id}\n{tool}\n{key}\n{generation}"
    return uuid.UUID(hex=keyed_hash(message)[:32])


@cache
def _database_born() -> str:
    """When this database was first migrated (read once per process: it never changes)."""
    row = db.fetchone("SELECT min(applied) FROM django_migrations", [])
    assert row is not None  # an aggregate without GROUP BY always returns a row
    return str(row[0])


def claim_operation_id(tenant_id: int, tool: str, key: str) -> uuid.UUID:
    """The id the key's next claim takes, which is also the id an uncommitted claim of it holds:
    the first of the key's ids (operation_id_for) that no committed record of the key has.

    (Records are never deleted, so a freed key's earlier ids stay taken and an id names one
    operation only. Records from before ids were derived have random ones, which take none.)
    """
    taken = set(records_with_key(key, tenant_ids=[tenant_id], tools=[tool]).values_list("operation_id", flat=True))
    generation = 0
    while (operation_id := operation_id_for(tenant_id, tool, key, generation)) in taken:
        generation += 1
    return operation_id


def uncommitted(op: Operation) -> IdempotencyRecord:
    """The key's record as a follower can know it while another call's claim of it is uncommitted
    (a local tool's, held in its transaction): not saved, PROCESSING, under the operation id that
    claim took, so that the follower's in_progress answer names what it can ask about."""
    return IdempotencyRecord(tenant_id=op.tenant_id, tool=op.tool, key=op.key, status=RecordStatus.PROCESSING,
                             operation_id=op.operation_id or claim_operation_id(op.tenant_id, op.tool, op.key))


def claimed_in_flight(tenant_id: int, operation_id: uuid.UUID, tools: list[str]) -> str | None:
    """Which of `tools` an uncommitted claim of `operation_id` in this tenant is for, if one is open.

    Its record cannot be read before it commits; the claim statement also takes an advisory lock
    named by (tenant, tool) and the id (`_claim_sql`), which pg_locks shows to every other
    session until that transaction ends (our own session's claims we can read). 31 bits of the
    id: another id matching is vanishingly rare (and needs a claim in flight at that moment).
    """
    names = {_lock_key(f"{tenant_id}\n{tool}"): tool for tool in tools}
    with connection.cursor() as cursor:
        cursor.execute("SELECT classid::bigint FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2 "
                       "AND objid::bigint = %s AND pid <> pg_backend_pid() AND database = (SELECT oid FROM pg_database "
                       "WHERE datname = current_database())", [_lock_key(operation_id.hex)])
        return next((names[classid] for (classid,) in cursor.fetchall() if classid in names), None)


def _lock_key(name: str) -> int:
    """31 bits of a keyed hash of `name`: one half of the advisory lock a claim takes (positive, so
    the int4 the lock is taken with and the oid pg_locks shows are the same number)."""
    return int(keyed_hash(name)[:8], 16) & 0x7FFFFFFF


DOWNSTREAM_KEY_PREFIX = "idemops-"


def downstream_key(operation_id: uuid.UUID) -> str:
    """The key sent to a downstream system: one per operation, so every retry of it is deduplicated
    there, and a key freed after its retention (retired or released) is a new operation there too."""
    return f"{DOWNSTREAM_KEY_PREFIX}{operation_id.hex}"


def operation_id_of(key: str) -> uuid.UUID | None:
    """The operation a downstream key stands for (None: not one of ours)."""
    if not key.startswith(DOWNSTREAM_KEY_PREFIX):
        return None
    try:
        return uuid.UUID(hex=key.removeprefix(DOWNSTREAM_KEY_PREFIX))
    except ValueError:
        return None


def _claim_or_fetch(record: IdempotencyRecord, claimed_event: AuditEvent, computed: list[models.Field[Any, Any]]
                    ) -> tuple[Any, ...] | None:
    """One statement: INSERT the record and its audit event, unless a live record holds the key:
    (the live or inserted record's id, the `computed` fields' values, whether this call inserted it,
    the statement's time), or None.

    Two first calls racing both pass the NOT EXISTS; PostgreSQL makes the
    second INSERT wait for the first's transaction and then skip (ON CONFLICT
    DO NOTHING), so exactly one inserts. The loser's statement returns no row
    (its snapshot predates the winner's commit) and the caller reads again.

    That wait is bounded by the follower wait: the statement sets lock_timeout
    for itself (set_config(..., true) lasts to the end of the transaction) and,
    once its row is in, puts back the value it found, so the executor's own
    statements after the claim wait for locks as they always would.

    The inserted claim also takes a shared advisory lock until its transaction ends (`announced`):
    while a local tool's claim is uncommitted, that lock is how get_operation learns the
    operation is running (claimed_in_flight).
    """
    wait_ms = f"{max(1, int(conf().follower_wait_seconds * 1000))}ms"
    sql = _claim_sql(db.insert_sql(record), db.insert_sql(claimed_event, CLAIMED_EVENT_ID),
                     tuple(field.column for field in computed))
    return db.fetchone(sql, [record.tenant_id, record.tool, *keys.stored_forms(record.key), *db.insert_params(record),
                             wait_ms, *db.insert_params(claimed_event, CLAIMED_EVENT_ID),
                             _lock_key(f"{record.tenant_id}\n{record.tool}"), _lock_key(record.operation_id.hex)])


CLAIMED_EVENT_ID = {"object_id": "claimed.id::text"}


def _computed_fields(record: IdempotencyRecord) -> list[models.Field[Any, Any]]:
    """The fields of a new record whose value the database computes (its clock)."""
    return [field for field in IdempotencyRecord._meta.concrete_fields if db.is_expression(getattr(record,
                                                                                                  field.attname))]


@cache
def _claim_sql(record_sql: tuple[tuple[str, ...], tuple[str, ...]], audit_sql: tuple[tuple[str, ...], tuple[str, ...]],
               computed: tuple[str, ...]) -> str:
    """The claim statement for a record of this shape: it returns the id, the `computed` columns,
    whether this call inserted the row, and the database's time of the statement."""
    (columns, values), (audit_columns, audit_values) = record_sql, audit_sql
    records = db.table(IdempotencyRecord)
    returned = "".join(f", {column}" for column in computed)
    unknown = ", NULL" * len(computed)
    return f"""
        WITH prior AS MATERIALIZED (
            SELECT current_setting('lock_timeout') AS lock_timeout
        ), live AS (
            SELECT id FROM {records}
            WHERE tenant_id = %s AND tool = %s AND key IN (%s, %s) AND retired_at IS NULL
        ), claimed AS (
            INSERT INTO {records} ({", ".join(columns)}) SELECT {", ".join(values)}
            WHERE NOT EXISTS (SELECT FROM live)
              AND set_config('lock_timeout', CASE WHEN (SELECT lock_timeout FROM prior) IS NOT NULL
                                                  THEN %s END, true) IS NOT NULL
            ON CONFLICT DO NOTHING RETURNING id{returned}
        ), audited AS (
            INSERT INTO {db.table(AuditEvent)} ({", ".join(audit_columns)})
            SELECT {", ".join(audit_values)} FROM claimed
        ), announced AS MATERIALIZED (
            SELECT pg_try_advisory_xact_lock_shared(%s, %s) FROM claimed
        )
        SELECT id{returned}, set_config('lock_timeout', (SELECT lock_timeout FROM prior), true) IS NOT NULL,
               statement_timestamp() FROM claimed, announced
        UNION ALL
        SELECT id{unknown}, false, statement_timestamp() FROM live
    """


# What a replay reads and answers with; a follower that gets another answer loads the rest (`whole`).
REPLAY_FIELDS = ("id", "tenant_id", "tool", "key", "fingerprint", "fingerprint_version", "status", "result",
                 "operation_id", "created_at", "expires_at", "ongoing")


def find_live(op: Operation) -> IdempotencyRecord | None:
    """The live record of `op`'s key, if any: one indexed read of what a replay needs, with the
    database's time of the read (`read_at`)."""
    row = db.fetchone(_find_live_sql(), (op.tenant_id, op.tool, *keys.stored_forms(op.key)))
    if row is None:
        return None
    record = db.from_row(IdempotencyRecord, row[:-1], fields=REPLAY_FIELDS)
    record.__dict__["read_at"] = row[-1]  # as annotate(read_at=NOW) would: not a declared attribute
    return record


@cache
def _find_live_sql() -> str:
    _, select_list = db.select_columns(IdempotencyRecord, fields=REPLAY_FIELDS)
    return (f"SELECT {select_list}, statement_timestamp() FROM {db.table(IdempotencyRecord)} "
            "WHERE tenant_id = %s AND tool = %s AND key IN (%s, %s) AND retired_at IS NULL")


def whole(record: IdempotencyRecord) -> IdempotencyRecord:
    """`record` with every field loaded (one read, with a new `read_at`, only if `find_live` left some out)."""
    return reread(record) if record.get_deferred_fields() else record


def _operation_id_taken(operation_id: uuid.UUID) -> bool:
    return IdempotencyRecord.objects.filter(operation_id=operation_id).exists()


def _transition(record: IdempotencyRecord, expected: dict[str, Any], changes: dict[str, Any], *, action: str,
                actor: str, reason: str = "", evidence: dict[str, Any] | list[dict[str, Any]] | None = None,
                trace_id: str = "", before: dict[str, Any] | None = None,
                after: dict[str, Any] | None = None, attributes: dict[str, str] | None = None) -> bool:
    """core.db.transition for a record: it also stamps `updated_at`, the event records the status
    before and after (unless told otherwise), `evidence`, if any, is appended to the record's, and
    `attributes` (search fields found in a result) are added to its attributes."""
    changes = {**changes, "updated_at": clock.NOW}
    entries = [evidence] if isinstance(evidence, dict) else list(evidence or [])
    append: dict[str, list[Any] | dict[str, Any]] = {"evidence": entries} if entries else {}
    if attributes:
        append["attributes"] = attributes
    return db.transition(
        record, expected, changes, action=action, actor=actor, reason=reason, trace_id=trace_id or record.trace_id,
        before=before or {"status": record.status},
        after=after or {"status": changes.get("status", record.status),
                        **({"error_class": changes["error_class"]} if changes.get("error_class") else {})},
        append=append or None)


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
        "status": RecordStatus.SUCCEEDED, "result": result, "lease_owner": "", "lease_expires_at": None,
        "error_class": "", "error_message": "", **_finished(),
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


def reclaim(record: IdempotencyRecord, op: Operation) -> IdempotencyRecord | None:
    """FAILED(transient or rate_limited) -> PROCESSING for a retry with the same key and arguments.

    Guarded by the attempt count we saw, so of several racing retries one wins.
    """
    if not _transition(record, {
        "status": RecordStatus.FAILED, "error_class__in": sorted(map(str, RETRYABLE)),
        "fingerprint": op.fingerprint_at(record.fingerprint_version), "fingerprint_version": record.fingerprint_version,
        "attempts": record.attempts,
    }, {
        "status": RecordStatus.PROCESSING, "attempts": record.attempts + 1, "lease_owner": leases.new_owner(),
        "lease_expires_at": leases.expiry(lease_seconds()), "error_class": "", "error_message": "",
        "retry_not_before": None, "finished_at": None, "trace_id": op.trace_id or record.trace_id,
        "span_id": op.span_id if op.trace_id else record.span_id,
    }, action="record.reclaimed", actor=op.actor):
        return None
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
    forever, or where it is unfinished but the key may expire."""
    return _transition(record, {"ongoing": True}, {"ongoing": False, "expires_at": clock.later(retention)},
                       action="record.retention_from_end", actor=actor, reason=reason,
                       before={"ongoing": True}, after={"ongoing": False, "retention_seconds":
                                                        retention.total_seconds()})


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
        "status": RecordStatus.SUCCEEDED, "result": result, "error_class": "", "error_message": "",
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
