"""The claim of a key: who executes an operation, and what a follower reads.

The claim is one INSERT ... ON CONFLICT DO NOTHING against the partial unique constraint on
(tenant, tool, key), with its audit event, in one statement (`_claim_sql`): never check-then-insert.
Its caller is the executor if its row went in, else a follower of the live record, whose replay
fields the same statement read (`find_live` reads them alone where a call must not claim yet,
`whole` the rest). A transient failure is claimed again by `reclaim`,
guarded by the attempt count. An operation's id is a function of its key (`operation_id_for`), so a
follower can name an uncommitted claim (`claim_operation_id`, `uncommitted`) and get_operation can
see one in flight (`claimed_in_flight`); `downstream_key` is the key sent downstream for it.

The record's other changes, each a guarded UPDATE, are in `transitions.py`.
"""

from __future__ import annotations

import uuid
from functools import cache
from typing import Any

from django.db import DEFAULT_DB_ALIAS, OperationalError, connection

from tools_app.conf import conf
from tools_app.core import audit, clock, db, instances, keys, leases, personal, tracing
from tools_app.core.errors import RETRYABLE
from tools_app.core.keys import keyed_hash
from tools_app.core.models import AuditEvent
from tools_app.engine.lookup import records_with_key
from tools_app.engine.models import IdempotencyRecord, RecordStatus
from tools_app.engine.operation import ClaimWaitExpired, Operation, operation_id_spent, searchable
from tools_app.engine.transitions import _transition, lease_seconds, reread

# SQLSTATE of a lock wait that ran past lock_timeout.
LOCK_NOT_AVAILABLE = "55P03"


def claim(op: Operation) -> tuple[IdempotencyRecord, bool]:
    """Return (record, True) if this call inserted the PROCESSING record for
    `op` and is its executor, or (the live record, False) for a follower.

    For a local tool it runs inside the business transaction (engine.run): the
    claim commits with the side effect or not at all. A concurrent caller's
    INSERT then waits on the unique index for that transaction, at most
    IDEMOPS_FOLLOWER_WAIT_SECONDS (then `ClaimWaitExpired`), and reads the
    committed record once it ends. A replay is answered from the same statement, which reads what it
    needs of a live record. The record carries `read_at`, the database's time of the read.
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
    parts = db.insert_parts(record)
    computed = parts.computed
    try:
        row = _claim_or_fetch(record, parts, claimed_event)
    except OperationalError as exc:
        if getattr(exc.__cause__, "sqlstate", None) == LOCK_NOT_AVAILABLE:
            raise ClaimWaitExpired(op.key) from exc
        raise
    if row is not None:
        inserted, read_at = row[len(computed) + 1], row[len(computed) + 2]
        if not inserted:
            # A live record holds the key: the statement read what a replay needs of it.
            return _read((row[0], *row[len(computed) + 3:]), read_at), False
        # Ours: the row holds what we built, and the times the database computed for it.
        record.pk = row[0]
        record._state.adding, record._state.db = False, DEFAULT_DB_ALIAS
        for field, value in zip(computed, row[1:len(computed) + 1], strict=True):
            setattr(record, field.attname, db.converted(field, value))
        record.__dict__["read_at"] = read_at  # as annotate(read_at=NOW) would: not a declared attribute
        return record, True
    # We lost a race to a claim our statement's snapshot could not see: read it now.
    if live := find_live(op):
        return live, False
    if op.operation_id is not None and _operation_id_taken(op.operation_id):
        # Not a lost race: an issued id whose record was retired meanwhile (retention ended, or an
        # operator released it) conflicts with that record's operation_id and never inserts.
        raise operation_id_spent(op.operation_id)
    # It is gone already (retired, or its transaction rolled back), or the id we offered is a
    # retired record's (the key's first id, and the key was used before): offer the key's next id.
    return _claim(op, claim_operation_id(op.tenant_id, op.tool, op.key))


def new_record(op: Operation, operation_id: uuid.UUID | None = None) -> IdempotencyRecord:
    """The PROCESSING record a claim of `op` inserts (not saved; its times are the database's,
    computed by the INSERT), named `operation_id` (by default, its key's first: operation_id_for)."""
    operation_id = op.operation_id or operation_id or operation_id_for(op.tenant_id, op.tool, op.key, 0)
    return instances.unsaved(
        IdempotencyRecord, tenant_id=op.tenant_id, tool=op.tool, key=op.key, fingerprint=op.fingerprint,
        fingerprint_version=op.fingerprint_version, field_digests=op.field_digests,
        arguments=personal.sealing(op.stored_arguments, op.tenant_id, op.retention),
        attributes=searchable(op.arguments, op.search_fields),
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


def _claim_or_fetch(record: IdempotencyRecord, parts: db.InsertParts, claimed_event: AuditEvent
                    ) -> tuple[Any, ...] | None:
    """One statement: INSERT the record (its `parts`) and its audit event, unless a live record holds the key:
    (the inserted record's id and its computed fields' values, whether this call inserted it, the
    statement's time, and a live record's REPLAY_FIELDS), or None.

    The claim is also the replay's read: a call whose key is live reads what a replay answers with
    in this one statement, so no call reads before it claims.

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
    event = db.insert_parts(claimed_event, CLAIMED_EVENT_ID)
    sql = _claim_sql((parts.columns, parts.values), (event.columns, event.values),
                     tuple(field.column for field in parts.computed))
    return db.fetchone(sql, [record.tenant_id, record.tool, *keys.stored_forms(record.key), *parts.params,
                             wait_ms, *event.params,
                             _lock_key(f"{record.tenant_id}\n{record.tool}"), _lock_key(record.operation_id.hex)])


CLAIMED_EVENT_ID = {"object_id": "claimed.id::text"}


@cache
def _claim_sql(record_sql: tuple[tuple[str, ...], tuple[str, ...]], audit_sql: tuple[tuple[str, ...], tuple[str, ...]],
               computed: tuple[str, ...]) -> str:
    """The claim statement for a record of this shape: it returns the id, the `computed` columns,
    whether this call inserted the row, the database's time of the statement, and the replay's
    columns of a live record (REPLAY_FIELDS but the id)."""
    (columns, values), (audit_columns, audit_values) = record_sql, audit_sql
    records = db.table(IdempotencyRecord)
    returned = "".join(f", {column}" for column in computed)
    unknown = ", NULL" * len(computed)
    _, replay = db.select_columns(IdempotencyRecord, fields=REPLAY_FIELDS[1:])
    no_replay = ", NULL" * (len(REPLAY_FIELDS) - 1)
    return f"""
        WITH prior AS MATERIALIZED (
            SELECT current_setting('lock_timeout') AS lock_timeout
        ), live AS (
            SELECT id, {replay} FROM {records}
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
               statement_timestamp(){no_replay} FROM claimed, announced
        UNION ALL
        SELECT id{unknown}, false, statement_timestamp(), {replay} FROM live
    """


# What a replay reads and answers with; a follower that gets another answer loads the rest (`whole`).
REPLAY_FIELDS = ("id", "tenant_id", "tool", "key", "fingerprint", "fingerprint_version", "status", "result",
                 "operation_id", "created_at", "expires_at", "ongoing")


def find_live(op: Operation, *, purged: bool = True) -> IdempotencyRecord | None:
    """The live record of `op`'s key, if any: one indexed read of what a replay needs, with the
    database's time of the read (`read_at`).

    The key is looked up in both its forms (raw, and purged: `keys.stored_forms`), or with
    `purged=False` in its raw form only: one probe of the index, and no keyed hash to compute. That is
    for a caller whose miss goes on to the claim, which finds a purged key's record all the same (its
    statement looks in both forms): a replay's read, where keys are seldom purged ones."""
    forms = keys.stored_forms(op.key) if purged else (op.key,)
    row = db.fetchone(_find_live_sql(len(forms)), (op.tenant_id, op.tool, *forms))
    return None if row is None else _read(row[:-1], row[-1])


def _read(row: tuple[Any, ...], read_at: Any) -> IdempotencyRecord:
    """The live record of a row of its REPLAY_FIELDS, read at the database's time `read_at`."""
    record = db.from_row(IdempotencyRecord, row, fields=REPLAY_FIELDS)
    record.__dict__["read_at"] = read_at  # as annotate(read_at=NOW) would: not a declared attribute
    return record


@cache
def _find_live_sql(forms: int) -> str:
    _, select_list = db.select_columns(IdempotencyRecord, fields=REPLAY_FIELDS)
    return (f"SELECT {select_list}, statement_timestamp() FROM {db.table(IdempotencyRecord)} "
            f"WHERE tenant_id = %s AND tool = %s AND key IN ({', '.join(['%s'] * forms)}) AND retired_at IS NULL")


def whole(record: IdempotencyRecord) -> IdempotencyRecord:
    """`record` with every field loaded (one read, with a new `read_at`, only if `find_live` left some out)."""
    return reread(record) if record.get_deferred_fields() else record


def _operation_id_taken(operation_id: uuid.UUID) -> bool:
    return IdempotencyRecord.objects.filter(operation_id=operation_id).exists()


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
