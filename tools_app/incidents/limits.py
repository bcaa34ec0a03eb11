"""A limit on calls in flight per downstream system, shared by every process: IDEMOPS_DOWNSTREAM_MAX_IN_FLIGHT
leased slots in PostgreSQL (DownstreamSlot rows, made once per downstream and limit).

A call takes a free slot (one whose lease is empty or ran out) with one UPDATE ... FOR UPDATE SKIP
LOCKED, so two processes never take the same one and neither waits for the other; it frees it when
its request ends. A process that dies holding one loses it when the lease (the request's timeout and
a margin) runs out. Leases rather than advisory locks: they hold through a transaction-mode pooler.

After an outage, the retries of every agent and the reconciler's lookups all come due together:
the limit keeps them from knocking the downstream over again. One over the limit answers `transient`
before anything is sent (a known non-execution); the reconciler's lookup waits its turn.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

from idemops.conf import conf
from tools_app.core import db, leases
from tools_app.core.errors import Held
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
