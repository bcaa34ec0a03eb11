"""A limit on calls in flight per downstream system, shared by every process: IDEMOPS_DOWNSTREAM_MAX_IN_FLIGHT
leased slots in PostgreSQL (DownstreamSlot rows, made once per downstream and limit).

A call takes a free slot (one whose lease is empty or ran out) with one UPDATE ... FOR UPDATE SKIP
LOCKED, so two processes never take the same one and neither waits for the other; it frees it when
its request ends. A process that dies holding one loses it when the lease (the request's timeout and
a margin) runs out. Leases rather than advisory locks: they hold through a transaction-mode pooler.

After an outage, the retries of every agent and the reconciler's lookups all come due together:
the limit keeps them from knocking the downstream over again. One over the limit answers `transient`
before anything is sent (a known non-execution); the reconciler's lookup waits its turn.

The same slots hold one operation at a time per business entity (`one_at_a_time`, a tool's
`concurrency_key`): one slot per entity, named `entity:<tenant>:<key>`, taken by one INSERT ... ON
CONFLICT DO UPDATE where its lease is empty or ran out, renewed while the run lasts (core.leases),
and deleted when it ends, so the table holds only the entities busy now.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

from tools_app.conf import conf
from tools_app.core import db, leases
from tools_app.core.errors import Held, InProgress
from tools_app.incidents.models import DownstreamSlot

# A request's slot is leased for its timeout plus this margin.
LEASE_MARGIN_SECONDS = 5.0
FULL_RETRY_AFTER_SECONDS = 1.0
_made: set[tuple[str, int]] = set()


class Full(Held):
    """Every slot of the downstream is taken: nothing was sent."""


@contextmanager
def in_flight(downstream: str, *, seconds: float) -> Iterator[None]:
    """Hold one of `downstream`'s slots while the block sends its request (at most `seconds`), or
    raise Full at once."""
    limit = conf().downstream_max_in_flight
    if limit == 0:
        yield
        return
    holder = leases.new_owner()
    slot = _take(downstream, limit, holder, seconds + LEASE_MARGIN_SECONDS)
    if slot is None:
        raise Full(f"{limit} calls to the downstream system {downstream} are in flight already; nothing was sent; "
                   "retry with the same key after retry_after",
                   retry_after=FULL_RETRY_AFTER_SECONDS, details={"in_flight_limit": downstream})
    try:
        yield
    finally:
        db.fetchone(f"UPDATE {db.table(DownstreamSlot)} SET holder = '', held_until = NULL "
                    "WHERE id = %s AND holder = %s RETURNING id", [slot, holder])


def _take(downstream: str, limit: int, holder: str, seconds: float) -> int | None:
    if (downstream, limit) not in _made:
        _make(downstream, limit)
    slot = _update(downstream, limit, holder, seconds)
    if slot is None:
        # Full, or the slots this process made are gone (a transaction that made them rolled back, a
        # clean-up): make sure they exist, then ask once more.
        _make(downstream, limit)
        slot = _update(downstream, limit, holder, seconds)
    return slot


def _make(downstream: str, limit: int) -> None:
    db.fetchone(f"INSERT INTO {db.table(DownstreamSlot)} (downstream, slot, holder) "
                "SELECT %s, n, '' FROM generate_series(0, %s) n ON CONFLICT DO NOTHING RETURNING id",
                [downstream, limit - 1])
    _made.add((downstream, limit))


def _update(downstream: str, limit: int, holder: str, seconds: float) -> int | None:
    table = db.table(DownstreamSlot)
    row = db.fetchone(
        f"UPDATE {table} SET holder = %s, held_until = statement_timestamp() + %s FROM ("
        f"SELECT id FROM {table} WHERE downstream = %s AND slot < %s "
        "AND (held_until IS NULL OR held_until < statement_timestamp()) "
        f"ORDER BY slot LIMIT 1 FOR UPDATE SKIP LOCKED) free WHERE {table}.id = free.id RETURNING {table}.id",
        [holder, timedelta(seconds=seconds), downstream, limit])
    return None if row is None else int(row[0])


ENTITY_PREFIX = "entity:"
_NAME_MAX = 200  # DownstreamSlot.downstream


def entity_slot_name(tenant_id: int, key: str) -> str:
    """The slot of one business entity of one tenant (a long key is shortened to its digest)."""
    name = f"{ENTITY_PREFIX}{tenant_id}:{key}"
    if len(name) <= _NAME_MAX:
        return name
    return f"{ENTITY_PREFIX}{tenant_id}:sha256:{hashlib.sha256(key.encode()).hexdigest()}"


@contextmanager
def one_at_a_time(name: str, *, wait: float, what: str) -> Iterator[InProgress | None]:
    """Hold the one slot named `name` while the block runs, waiting at most `wait` seconds for it.

    Yields None while held; yields an `in_progress` failure (retry_after, and nothing held) when
    another holder kept it for the whole wait. The lease is the executor's (IDEMOPS_EXECUTION_LEASE_SECONDS)
    renewed on the process's lease keeper, so a run longer than a lease keeps it and a dead process
    loses it when the lease runs out.
    """
    settings = conf()
    holder = leases.new_owner()
    lease = timedelta(seconds=settings.execution_lease_seconds)
    slot = _claim_one(name, holder, lease)
    deadline = time.monotonic() + wait
    pause = 0.01
    while slot is None and (remaining := deadline - time.monotonic()) > 0:
        time.sleep(min(pause, remaining))
        pause = min(pause * 2, 0.2)
        slot = _claim_one(name, holder, lease)
    if slot is None:
        yield InProgress(f"another operation on {what} is running, and they run one at a time; nothing was done "
                         "yet: ask again with the same key after retry_after",
                         retry_after=settings.in_progress_retry_after_seconds,
                         details={"concurrency_key": what})
        return
    table = db.table(DownstreamSlot)

    def renew() -> bool:
        return db.fetchone(f"UPDATE {table} SET held_until = statement_timestamp() + %s WHERE id = %s AND holder = %s "
                           "RETURNING id", [lease, slot, holder]) is not None

    try:
        with leases.Heartbeat(renew, leases.heartbeat_interval(settings.execution_heartbeat_seconds,
                                                               settings.execution_lease_seconds), f"slot {name}"):
            yield None
    finally:
        db.fetchone(f"DELETE FROM {table} WHERE id = %s AND holder = %s RETURNING id", [slot, holder])


def _claim_one(name: str, holder: str, lease: timedelta) -> int | None:
    table = db.table(DownstreamSlot)
    row = db.fetchone(
        f"INSERT INTO {table} AS s (downstream, slot, holder, held_until) "
        "VALUES (%s, 0, %s, statement_timestamp() + %s) "
        "ON CONFLICT (downstream, slot) DO UPDATE SET holder = EXCLUDED.holder, held_until = EXCLUDED.held_until "
        "WHERE s.held_until IS NULL OR s.held_until < statement_timestamp() RETURNING s.id",
        [name, holder, lease])
    return None if row is None else int(row[0])
