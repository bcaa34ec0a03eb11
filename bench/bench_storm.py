"""P5: a storm of identical calls: how long the followers take compared with the one executor.

50 callers, each a process of its own with its own database connection (as 50 web workers'
database threads would be, without one interpreter's lock between them), call `create_order`
through `toolkit.calls.call_tool` with the same key and arguments at the same moment. One
executes; the others follow: a local tool's followers wait on the unique index for the
executor's transaction and read its committed result. The executor's handler is held for a fixed
time standing for the tool's own work, so the figure shows the followers' delay over the
executor rather than how small a no-op is.

P5 = the followers' p99 latency / the executor's latency (from the same start), the median of the
storms.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import statistics
import time
import uuid

from bench.common import Section, at_most, live_statistics, percentile, spread

CALLERS = 50
STORMS, QUICK_STORMS = 5, 2
WORK_SECONDS = 0.05  # the executor's own work inside its transaction (a handler doing real work)


def storm(tool: str, arguments: dict, caller, *, work: float) -> tuple[float, list[float]]:
    """One storm: (the executor's latency, the followers' latencies), in seconds."""
    from django.db import connections

    connections.close_all()  # each caller opens its own after the fork
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(CALLERS)
    answers = context.Queue()
    callers = [context.Process(target=_one_call, args=(tool, arguments, caller, work, barrier, answers))
               for _ in range(CALLERS)]
    for process in callers:
        process.start()
    results = [answers.get(timeout=120) for _ in callers]
    for process in callers:
        process.join(30)
    executors = [elapsed for elapsed, replayed, error in results if error is None and not replayed]
    followers = [elapsed for elapsed, replayed, error in results if replayed]
    problems = [error for _, _, error in results if error is not None]
    if problems or len(executors) != 1:
        raise AssertionError(f"a storm must execute once and replay the rest: {len(executors)} executed, "
                             f"errors {problems[:3]}")
    return executors[0], followers


def _one_call(tool: str, arguments: dict, caller, work: float, barrier, answers) -> None:
    """One caller, in a process of its own with its own database connection."""
    from django.db import connections

    from tools_app.toolkit.calls import call_tool
    from tools_app.toolkit.registry import get_tool

    spec = get_tool(tool)
    slowed = dataclasses.replace(spec, handler=_slowed(spec.handler, work))
    try:
        connections["default"].ensure_connection()
        barrier.wait(60)
        started = time.perf_counter()
        result = call_tool(slowed, caller, arguments)
        elapsed = time.perf_counter() - started
        answers.put((elapsed, result.replayed, result.error.error_class if result.error else None))
    except Exception as exc:
        answers.put((0.0, False, f"{type(exc).__name__}: {exc}"))
    finally:
        connections.close_all()


def raw_storm(key: str, *, work: float) -> tuple[float, list[float]]:
    """The same storm with no platform at all: each process, on a raw psycopg connection opened before the
    start, inserts the key into a minimal table (`ON CONFLICT DO NOTHING RETURNING id`) in a transaction;
    the one that inserts it works `work` seconds, stores its result and commits; the others wait on the
    unique index for that commit, insert nothing, and read the result. The floor of P5 on this machine."""
    from django.db import connection, connections

    dsn = {"dbname": connection.settings_dict["NAME"], "host": connection.settings_dict["HOST"],
           "user": connection.settings_dict["USER"], "port": connection.settings_dict["PORT"] or None}
    connections.close_all()
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(CALLERS)
    answers = context.Queue()
    callers = [context.Process(target=_one_raw_call, args=(dsn, key, work, barrier, answers)) for _ in range(CALLERS)]
    for process in callers:
        process.start()
    results = [answers.get(timeout=120) for _ in callers]
    for process in callers:
        process.join(30)
    executors = [elapsed for elapsed, replayed in results if not replayed]
    assert len(executors) == 1, f"the raw storm must insert once: {len(executors)} inserted"
    return executors[0], [elapsed for elapsed, replayed in results if replayed]


RAW_TABLE = "bench_storm_raw"


def _one_raw_call(dsn: dict, key: str, work: float, barrier, answers) -> None:
    import psycopg

    with psycopg.connect(**dsn) as conn:
        barrier.wait(60)
        started = time.perf_counter()
        with conn.transaction():
            inserted = conn.execute(f"INSERT INTO {RAW_TABLE} (key) VALUES (%s) ON CONFLICT DO NOTHING RETURNING id",
                                    [key]).fetchone()
            if inserted:
                time.sleep(work)
                conn.execute(f"UPDATE {RAW_TABLE} SET result = %s WHERE id = %s", ['{"ok": true}', inserted[0]])
        if not inserted:
            result = conn.execute(f"SELECT result FROM {RAW_TABLE} WHERE key = %s", [key]).fetchone()
            assert result and result[0] == {"ok": True}
        answers.put((time.perf_counter() - started, not inserted))


def _slowed(handler, work: float):
    def slowed(ctx, args):
        time.sleep(work)
        return handler(ctx, args)
    return slowed


def run(quick: bool = False) -> Section:
    from tools_app import access
    from tools_app.toolkit.calls import Caller

    storms = QUICK_STORMS if quick else STORMS
    tenant = access.create_tenant(f"bench-storm-{uuid.uuid4().hex[:6]}")
    caller = Caller(tenant_id=tenant.pk, actor="agent:bench-storm/bot")
    order = {"customer": "ACME", "items": [{"sku": "BOLT-1", "quantity": 3, "unit_price": "2.50"}], "currency": "EUR"}
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(f"CREATE TABLE IF NOT EXISTS {RAW_TABLE} (id bigserial PRIMARY KEY, key text UNIQUE, "
                       "result jsonb)")
    ratios, executor_ms, p99_ms, floors, floor_ms = [], [], [], [], []
    # A warm server: one call first, as a web process has served calls before a storm reaches it. Its data
    # keys (issue 41's sealing of personal values) are then in memory, which the forked callers inherit, as
    # a long-lived process keeps them; without it each of the 50 fresh processes would fetch them first.
    from tools_app.toolkit.calls import call_tool
    from tools_app.toolkit.registry import get_tool

    warm = call_tool(get_tool("create_order"), caller, {**order, "idempotency_key": uuid.uuid4().hex})
    assert warm.error is None, warm.error
    live_statistics()
    for _ in range(storms):
        executor, followers = storm("create_order", {**order, "idempotency_key": uuid.uuid4().hex}, caller,
                                       work=WORK_SECONDS)
        p99 = percentile(followers, 0.99)
        ratios.append(p99 / executor)
        executor_ms.append(executor * 1000)
        p99_ms.append(p99 * 1000)
        raw_executor, raw_followers = raw_storm(uuid.uuid4().hex, work=WORK_SECONDS)
        floors.append(percentile(raw_followers, 0.99) / raw_executor)
        floor_ms.append((raw_executor * 1000, percentile(raw_followers, 0.99) * 1000))
    p5 = at_most("P5", "followers' p99 / the executor's latency, 50 identical create_order calls", ratios, 1.2,
                 executor_ms=statistics.median(executor_ms), follower_p99_ms=statistics.median(p99_ms),
                 work_ms=WORK_SECONDS * 1000, floor=statistics.median(floors),
                 to_floor=statistics.median(to_floor := [r / f for r, f in zip(ratios, floors, strict=True)]))
    rows = [f"| {n + 1} | {e:.1f} | {p:.1f} | {r:.2f}× | {fe:.1f} | {fp:.1f} | {f:.2f}× |" for n, (e, p, r, f, (fe, fp))
            in enumerate(zip(executor_ms, p99_ms, ratios, floors, floor_ms, strict=True))]
    return Section("\n".join([
        "## P5: a storm of 50 identical calls", "",
        f"{CALLERS} processes, each with its own database connection, call `create_order` with one key at once; "
        f"the executor's handler works {WORK_SECONDS * 1000:.0f} ms inside its transaction. Followers wait on "
        "the unique index for the executor's transaction and read its committed result. Each storm is followed "
        "by the same storm with no platform (`raw_storm`: 50 processes on raw psycopg connections, a minimal "
        "table, `INSERT … ON CONFLICT DO NOTHING RETURNING id`, the same work, then a `SELECT` by the followers): "
        "the floor's ratio, measured in the same run.", "",
        "| storm | executor ms | followers' p99 ms | ratio | floor: executor ms | floor: followers' p99 ms | "
        "the floor's ratio |", "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |", *rows, "",
        f"- P5: followers' p99 / executor = **{p5.value:.2f}×** (storms {p5.spread_cell()}; target ≤ 1.2×); "
        f"the floor's, in the same storms: {statistics.median(floors):.2f}× "
        f"({spread(floors)}). P5 / the floor's ratio, storm by storm: "
        f"**{statistics.median(to_floor):.2f}×** ({spread(to_floor)}; proposed target ≤ 1×: "
        "followers wait no longer, relative to their executor, than with no platform; docs/performance.md).", "",
    ]), [p5])
