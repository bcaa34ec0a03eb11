"""P3: the engine's first executions per second in process vs DBOS Transact one-step workflows.

Both in this process, one thread each, on the same PostgreSQL server (the benchmarks' embedded
cluster): the engine on the benchmark database, DBOS with its system database beside it. The
engine runs a local tool with a no-op side effect under a new key (the record, its two audit
events and the outcome, one commit); DBOS runs a workflow of one no-op step under a new workflow
id (its workflow status and the step's output). Then both replay what they ran (same key, same
workflow id). The two sides alternate in rounds. Beside them, the engine's statements sent alone from raw
psycopg, and the pieces of Python every first execution needs, each timed alone (bench/engine_pieces.py): what
4× leaves the engine over its statements, and what it cannot do without.

DBOS (`dbos` on PyPI) is installed for the benchmarks only (requirements-dev.txt).
"""

from __future__ import annotations

import collections
import statistics
import time
import uuid

from bench import engine_pieces
from bench.bench_engine import EngineStatements, raw_connection
from bench.common import (
    Section,
    at_least,
    fresh_database_url,
    live_statistics,
    local_session,
    session_cpu_seconds,
    spread,
)

ROUNDS, QUICK_ROUNDS = 5, 2
CALLS, QUICK_CALLS = 300, 40
PIECES, QUICK_PIECES = 5000, 50  # runs of each piece timed alone (engine_pieces)


def run(quick: bool = False) -> Section:
    from dbos import DBOS, SetWorkflowID
    from django.db import connection

    from tools_app import access, engine

    rounds, calls = (QUICK_ROUNDS, QUICK_CALLS) if quick else (ROUNDS, CALLS)
    settings = connection.settings_dict
    fresh_database_url("idemops_bench_dbos")
    system_database = f"postgresql+psycopg://{settings['USER']}@/idemops_bench_dbos?host={settings['HOST']}"
    DBOS(config={"name": "idemops-bench", "system_database_url": system_database, "log_level": "WARNING"})

    @DBOS.step()
    def no_op_step() -> dict:
        return {"ok": True}

    @DBOS.workflow()
    def one_step_workflow() -> dict:
        return no_op_step()

    DBOS.launch()
    tenant = access.create_tenant(f"bench-dbos-{uuid.uuid4().hex[:6]}")

    def operation(key: str) -> engine.Operation:
        return engine.Operation(tenant_id=tenant.pk, tool="bench", key=key, arguments={"n": 1}, actor="agent:bench/a")

    def engine_call(key: str) -> None:
        engine.run(operation(key), lambda record: {"ok": True})

    def dbos_call(key: str) -> None:
        with SetWorkflowID(key):
            one_step_workflow()

    def per_second(call, keys: list[str], cpu: str | None = None, session: int | None = None) -> float:
        """Calls per second of `call` over `keys`; with `cpu`, each call's CPU time in microseconds is kept
        under that name: this thread's (DBOS's own threads left out), and the database session's (`session`:
        its backend's pid)."""
        thread, server = time.thread_time(), session_cpu_seconds(session) if session is not None else None
        started = time.perf_counter()
        for key in keys:
            call(key)
        elapsed = time.perf_counter() - started
        if cpu is not None:
            cpu_us[cpu].append((time.thread_time() - thread) / len(keys) * 1e6)
            if session is not None and server is not None and (after := session_cpu_seconds(session)) is not None:
                cpu_us[f"{cpu}_session"].append((after - server) / len(keys) * 1e6)
        return len(keys) / elapsed

    rates: dict[str, list[float]] = {"engine": [], "dbos": [], "engine_replay": [], "dbos_replay": [],
                                     "engine_statements": [], "through_django": []}
    cpu_us: dict[str, list[float]] = collections.defaultdict(list)
    raw = raw_connection()
    try:
        warm = [f"warm-{uuid.uuid4().hex}" for _ in range(calls)]  # both sides' tables hold calls, with statistics
        per_second(engine_call, warm)
        per_second(dbos_call, warm)
        live_statistics("idemops_bench_dbos")
        # Captured among first calls (the warm-up's), as the rounds' first executions send them.
        captured = EngineStatements(engine_call, (f"captured-{uuid.uuid4().hex}", f"captured-{uuid.uuid4().hex}"))
        statements, through_django = captured.sender(raw), captured.through_django()
        connection.ensure_connection()
        sessions = {"engine": local_session(connection.connection), "engine_statements": local_session(raw)}
        for _ in range(rounds):
            keys = [uuid.uuid4().hex for _ in range(calls)]
            rates["engine"].append(per_second(engine_call, keys, "engine", sessions["engine"]))
            rates["dbos"].append(per_second(dbos_call, keys, "dbos"))
            rates["engine_statements"].append(per_second(statements, [f"sql-{key}" for key in keys],
                                                         "engine_statements", sessions["engine_statements"]))
            rates["through_django"].append(per_second(through_django, [f"django-{key}" for key in keys],
                                                      "through_django", sessions["engine"]))
            rates["engine_replay"].append(per_second(engine_call, keys))
            rates["dbos_replay"].append(per_second(dbos_call, keys))
        pieces = engine_pieces.measure(operation, QUICK_PIECES if quick else PIECES)
    finally:
        raw.close()
        DBOS.destroy()
    ratios = [e / d for e, d in zip(rates["engine"], rates["dbos"], strict=True)]
    # The engine's statements alone / DBOS, and the engine / its statements (rates: a ratio below 1 is slower).
    statements_ratios = [s / d for s, d in zip(rates["engine_statements"], rates["dbos"], strict=True)]
    within = [s / e for e, s in zip(rates["engine"], rates["engine_statements"], strict=True)]
    replay_ratios = [e / d for e, d in zip(rates["engine_replay"], rates["dbos_replay"], strict=True)]
    median = {name: statistics.median(values) for name, values in rates.items()}
    # What 4× leaves the engine's Python around its statements, per first execution (µs), and what it needs.
    allowed_us = 1e6 / (4 * median["dbos"]) - 1e6 / median["engine_statements"]
    _, needs_us = engine_pieces.total(pieces)
    cpu = {name: statistics.median(values) for name, values in cpu_us.items()}
    # Where the engine's time beyond its statements goes: Django's transaction and core.db around them, then the
    # engine's own Python; each in time, the calling thread's CPU and the database session's (µs a call).
    django_part = _difference(median, cpu, "through_django", "engine_statements")
    own_part = _difference(median, cpu, "engine", "through_django")
    p3 = at_least("P3", "engine first executions/s / DBOS one-step workflows/s", ratios, 4,
                  engine_per_s=median["engine"], dbos_per_s=median["dbos"],
                  replay_ratio=statistics.median(replay_ratios),
                  engine_statements_per_s=median["engine_statements"],
                  engine_statements_ratio=statistics.median(statements_ratios),
                  engine_over_statements=statistics.median(within), allowed_beyond_statements_us=allowed_us,
                  pieces_in_a_call_us=needs_us, django_and_db_us=django_part, engine_own_us=own_part)
    needed = statistics.median(statements_ratios) / 4  # the engine / its statements that 4× allows
    return Section("\n".join([
        "## P3: the engine vs DBOS Transact, in process", "",
        f"One thread each, same PostgreSQL server; {rounds} rounds of {calls} new operations, then their "
        "replays, the sides alternating (DBOS Transact 3.4, a workflow of one no-op step; the engine, a local "
        "tool with a no-op side effect).", "",
        "| path | per second (median of rounds) |", "| --- | ---: |",
        f"| the engine's statements alone, sent raw: BEGIN, claim, SUCCEEDED mark, COMMIT | "
        f"{median['engine_statements']:,.0f} |",
        f"| engine, first execution | {median['engine']:,.0f} |",
        f"| DBOS, new workflow | {median['dbos']:,.0f} |",
        f"| engine, replay | {median['engine_replay']:,.0f} |",
        f"| DBOS, replay of a finished workflow | {median['dbos_replay']:,.0f} |", "",
        f"- P3: engine / DBOS, first executions = **{p3.value:.1f}×** (rounds {p3.spread_cell()}; target ≥ 4×); "
        f"replays {statistics.median(replay_ratios):.1f}×.",
        f"- The engine's statements alone / DBOS: **{statistics.median(statements_ratios):.2f}×** (rounds "
        f"{spread(statements_ratios)}); the engine's first execution takes {statistics.median(within):.2f}× the "
        f"time of its statements (rounds {spread(within)}), where 4× DBOS allows "
        + (f"{needed:.2f}×." if needed > 1 else
           f"{needed:.2f}×: less than the statements alone, so 4× is out of reach of the statements a first "
           "execution sends."),
        (f"- So 4× leaves the engine **{allowed_us:.0f} µs** a first execution beyond its statements"
         if allowed_us > 0 else "- So 4× leaves the engine nothing beyond its statements")
        + f"; the pieces of Python every first execution needs, each timed alone right after a round trip as in a "
        f"call, take **{needs_us:.0f} µs** together (bench/engine_pieces.py):", "",
        *engine_pieces.table(pieces), "",
        "Where each first execution's time goes (the CPU time of the thread that calls, and of its database "
        "session from the kernel's scheduler statistics where the server runs on this machine; the rest is "
        "waiting: round trips, the disk's flush at COMMIT, another process on the core):", "",
        *_cpu_table(median, cpu, django_part, own_part), "",
        "Per operation the engine makes one durable commit (claim, side effect, outcome and two audit events "
        "together); a DBOS workflow records its status when it starts, the step's output, and its status when "
        "it ends.", "",
    ]), [p3])


def _per_call(median: dict[str, float], cpu: dict[str, float], name: str) -> dict[str, float | None]:
    """µs a call of side `name`: its time, the calling thread's CPU, its database session's CPU (None: not
    measured)."""
    return {"time": 1e6 / median[name], "cpu": cpu.get(name), "session_cpu": cpu.get(f"{name}_session")}


def _difference(median: dict[str, float], cpu: dict[str, float], upper: str, lower: str) -> dict[str, float | None]:
    """What side `upper` costs a call beyond side `lower`, in each of `_per_call`'s figures."""
    above, below = _per_call(median, cpu, upper), _per_call(median, cpu, lower)
    return {what: None if (a := above[what]) is None or (b := below[what]) is None else a - b for what in above}


def _cpu_table(median: dict[str, float], cpu: dict[str, float], django_part: dict[str, float | None],
               own_part: dict[str, float | None]) -> list[str]:
    """µs a first execution, median of the rounds: each side's time, calling thread's CPU and database session's
    CPU, and the two parts of the engine's beyond its statements."""
    def cells(figures: dict[str, float | None], bold: bool = False) -> str:
        mark = "**" if bold else ""
        return " | ".join("n/a" if value is None else f"{mark}{value:,.0f}{mark}" for value in figures.values())

    sides = (("the engine's statements alone, sent raw", "engine_statements"),
             ("the same statements in Django's transaction, through core.db", "through_django"),
             ("the engine", "engine"), ("DBOS (its sessions are a pool, not read)", "dbos"))
    return ["| µs a first execution (median of rounds) | time | the calling thread's CPU | its database session's "
            "CPU |", "| --- | ---: | ---: | ---: |",
            *(f"| {label} | {cells(_per_call(median, cpu, name))} |" for label, name in sides),
            f"| **Django's transaction and core.db beyond the raw statements** | {cells(django_part, True)} |",
            f"| **the engine's own Python beyond them** | {cells(own_part, True)} |"]
