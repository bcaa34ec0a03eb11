"""What the platform counts about itself, from every process, into one place in the database.

`count` and `observe` add to an in-process table (a dict lookup under a lock: no I/O on the
call's path); a daemon thread writes it about once a second with ONE statement that adds each
row to the per-minute rollup (MetricMinute: per tenant, tool and minute, what the dashboard and
its charts read) and to the running totals (MetricTotal: what `/metrics` serves as Prometheus
counters and histograms). So every web worker and every cluster process adds to the same
figures, a restart loses nothing that was written, and a crash loses at most the last second.

Counted only once committed: inside a transaction, a count waits for its commit (a rolled-back
transition counts nothing).

Each metric is declared here once (`Metric`); tools_app.metrics turns them into Prometheus names.
A histogram's bucket bounds are part of what is stored: change them and the metric needs a new
name (older rows would add up wrongly).
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import threading
import time
from bisect import bisect_left
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.db import close_old_connections, connection, transaction

from tools_app.core import db
from tools_app.core.models import MetricMinute, MetricTotal

logger = logging.getLogger(__name__)
FLUSH_INTERVAL_SECONDS = 1.0
# Shorter than PostgreSQL's deadlock_timeout (1 s): a flush that would deadlock gives up first.
LOCK_TIMEOUT = "200ms"


@dataclass(frozen=True)
class Metric:
    name: str  # as stored
    label: str = ""  # what the second label holds (outcome, result, step), if any
    buckets: tuple[float, ...] | None = None  # a histogram's upper bounds (seconds); None: a counter

    @property
    def histogram(self) -> bool:
        return self.buckets is not None


CALL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
STEP_BUCKETS = (0.05, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
LAG_BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 14400.0)

TOOL_CALL = Metric("tool_call", "outcome", CALL_BUCKETS)  # every MCP tool call: outcome and duration
PROCESSING_TIMEOUT = Metric("processing_timeout")  # an executor's lease ran out (engine.expire_lease)
DOWNSTREAM_DUPLICATE = Metric("downstream_duplicate")  # the downstream deduplicated our key, or refused it reused
RECONCILIATION = Metric("reconciliation", "result")  # an UNKNOWN record asked about or settled
TASK_STEP = Metric("task_step", "step", STEP_BUCKETS)  # a task step's run ended: its duration
TASK_LEASE_EXPIRY = Metric("task_lease_expiry")  # a task's worker died holding it
OUTBOX_DELIVERY = Metric("outbox_delivery", "", LAG_BUCKETS)  # an event delivered: created -> delivered
PROCESS_RESTART = Metric("process_restart", "process")  # `serve` restarted a process that died
TASK_JOB_LOST = Metric("task_job_lost")  # a queued task's job was lost: the sweep queued it again

METRICS = {metric.name: metric for metric in (TOOL_CALL, PROCESSING_TIMEOUT, DOWNSTREAM_DUPLICATE, RECONCILIATION,
                                              TASK_STEP, TASK_LEASE_EXPIRY, OUTBOX_DELIVERY, PROCESS_RESTART,
                                              TASK_JOB_LOST)}

# (minute as epoch seconds, tenant id, tool, metric, label) -> [count, sum, buckets]
_Key = tuple[int, int, str, str, str]
# [count: int, sum: float, buckets: list[int] | None], added to in place under _lock.
_Row = list[Any]
_pending: dict[_Key, _Row] = {}
_lock = threading.Lock()
_flusher: threading.Thread | None = None


def count(metric: Metric, *, tool: str = "", tenant_id: int | None = None, label: str = "", n: int = 1) -> None:
    """Add `n` to a counter."""
    _after_commit(metric, tool, tenant_id, label, n, None)


def observe(metric: Metric, seconds: float, *, tool: str = "", tenant_id: int | None = None, label: str = "") -> None:
    """Count one event of a histogram and how long it took."""
    _after_commit(metric, tool, tenant_id, label, 1, seconds)


def _after_commit(metric: Metric, tool: str, tenant_id: int | None, label: str, n: int, seconds: float | None
                  ) -> None:
    if _in_transaction():
        transaction.on_commit(lambda: _add(metric, tool, tenant_id, label, n, seconds))
    else:
        _add(metric, tool, tenant_id, label, n, seconds)


def _in_transaction() -> bool:
    """Whether this thread's database connection is in `atomic()`. In a thread running an event loop
    (the /mcp handlers count their calls there) it is not: Django runs no ORM work there
    (SynchronousOnlyOperation), and asking would build a connection object for each request, since
    Django keeps one per asyncio task (about 50 µs and garbage for the collector, per call)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return connection.in_atomic_block
    return False


def _add(metric: Metric, tool: str, tenant_id: int | None, label: str, n: int, seconds: float | None) -> None:
    key = (int(time.time()) // 60 * 60, tenant_id or 0, tool, metric.name, label)
    with _lock:
        row = _pending.get(key)
        if row is None:
            row = _pending[key] = [0, 0.0, [0] * (len(metric.buckets) + 1) if metric.buckets is not None else None]
        row[0] += n
        if seconds is not None:
            row[1] += seconds
            if row[2] is not None and metric.buckets is not None:
                row[2][bisect_left(metric.buckets, seconds)] += 1
    _ensure_flusher()


def flush() -> int:
    """Write what was counted since the last flush; returns how many rows it added to."""
    with _lock:
        rows = sorted(_pending.items())
        _pending.clear()
    if rows:
        try:
            _write(rows)
        except Exception:
            with _lock:  # keep the counts for the next flush (the database may be restarting)
                for key, (n, total, buckets) in rows:
                    _merge(key, n, total, buckets)
            raise
    return len(rows)


def _merge(key: _Key, n: int, total: float, buckets: list[int] | None) -> None:
    row = _pending.setdefault(key, [0, 0.0, [0] * len(buckets) if buckets is not None else None])
    row[0] += n
    row[1] += total
    if buckets is not None:
        row[2] = [a + b for a, b in zip(row[2], buckets, strict=True)]


def _array(values: list[int] | None) -> str | None:
    return None if values is None else "{" + ",".join(map(str, values)) + "}"


def _write(rows: list[tuple[_Key, _Row]]) -> None:
    """One statement: add each row to its minute and to its total (a new row, or added to the one there).

    Rows are sorted, so two processes flushing at once lock rows in the same order and never
    deadlock. It waits at most LOCK_TIMEOUT for a lock: behind a TRUNCATE or a migration holding
    the two tables in the other order it would deadlock; it gives up instead, and the counts wait
    for the next flush.
    """
    totals: dict[tuple[int, str, str, str], _Row] = {}
    for (_, tenant, tool, metric, label), (n, seconds, buckets) in rows:
        total = totals.setdefault((tenant, tool, metric, label), [0, 0.0, None])
        total[0] += n
        total[1] += seconds
        if buckets is not None:
            total[2] = buckets if total[2] is None else [a + b for a, b in zip(total[2], buckets, strict=True)]
    minutes: list[list[Any]] = [[datetime.fromtimestamp(key[0], UTC) for key, _ in rows], [key[1] for key, _ in rows],
               [key[2] for key, _ in rows], [key[3] for key, _ in rows], [key[4] for key, _ in rows],
               [row[0] for _, row in rows], [row[1] for _, row in rows], [_array(row[2]) for _, row in rows]]
    ordered = sorted(totals.items())
    summed: list[list[Any]] = [
        [key[0] for key, _ in ordered], [key[1] for key, _ in ordered], [key[2] for key, _ in ordered],
        [key[3] for key, _ in ordered], [row[0] for _, row in ordered], [row[1] for _, row in ordered],
        [_array(row[2]) for _, row in ordered]]
    added = ("count = t.count + EXCLUDED.count, sum = t.sum + EXCLUDED.sum, buckets = CASE WHEN t.buckets IS NULL "
             "THEN EXCLUDED.buckets ELSE ARRAY(SELECT x + y FROM unnest(t.buckets, EXCLUDED.buckets) WITH ORDINALITY "
             "AS u(x, y, i) ORDER BY i) END")
    sql = f"""
        WITH minutes AS (
            INSERT INTO {db.table(MetricMinute)} AS t (minute, tenant_id, tool, metric, label, count, sum, buckets)
            SELECT minute, tenant_id, tool, metric, label, n, s, b::bigint[]
            FROM unnest(%s::timestamptz[], %s::bigint[], %s::text[], %s::text[], %s::text[], %s::bigint[],
                        %s::float8[], %s::text[]) AS i(minute, tenant_id, tool, metric, label, n, s, b)
            ON CONFLICT (minute, tenant_id, tool, metric, label) DO UPDATE SET {added}
        )
        INSERT INTO {db.table(MetricTotal)} AS t (tenant_id, tool, metric, label, count, sum, buckets)
        SELECT tenant_id, tool, metric, label, n, s, b::bigint[]
        FROM unnest(%s::bigint[], %s::text[], %s::text[], %s::text[], %s::bigint[], %s::float8[], %s::text[])
             AS i(tenant_id, tool, metric, label, n, s, b)
        ON CONFLICT (metric, tool, label, tenant_id) DO UPDATE SET {added}
    """
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
        cursor.execute(sql, [*minutes, *summed])


def _ensure_flusher() -> None:
    global _flusher
    if _flusher is not None:
        return
    with _lock:
        if _flusher is None:
            _flusher = threading.Thread(target=_flush_forever, name="metrics-flusher", daemon=True)
            _flusher.start()
            atexit.register(_flush_quietly)


def _forget_after_fork() -> None:
    """A forked child (django-q2's workers) starts empty: the parent writes what it counted, and
    the child's flusher thread, lock included, is its own."""
    global _flusher, _lock
    _pending.clear()
    _flusher = None
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)


def _flush_forever() -> None:
    while True:
        time.sleep(FLUSH_INTERVAL_SECONDS)
        _flush_quietly()


def _flush_quietly() -> None:
    try:
        close_old_connections()
        flush()
    except Exception as exc:  # metrics must never take the server down; the counts wait for the next flush
        logger.warning("could not write metrics (%s); kept for the next flush", type(exc).__name__)
