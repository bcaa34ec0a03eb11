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

import statistics
import time
import uuid

from bench import engine_pieces
from bench.bench_engine import EngineStatements, raw_connection
from bench.common import Section, at_least, fresh_database_url, live_statistics, spread

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

    def per_second(call, keys: list[str]) -> float:
        started = time.perf_counter()
        for key in keys:
            call(key)
        return len(keys) / (time.perf_counter() - started)

    rates: dict[str, list[float]] = {"engine": [], "dbos": [], "engine_replay": [], "dbos_replay": [],
                                     "engine_statements": []}
    raw = raw_connection()
    try:
        warm = [f"warm-{uuid.uuid4().hex}" for _ in range(calls)]  # both sides' tables hold calls, with statistics
        per_second(engine_call, warm)
        per_second(dbos_call, warm)
        live_statistics("idemops_bench_dbos")
        # Captured among first calls (the warm-up's), as the rounds' first executions send them.
        statements = EngineStatements(engine_call, (f"captured-{uuid.uuid4().hex}", f"captured-{uuid.uuid4().hex}")
                                      ).sender(raw)
        for _ in range(rounds):
            keys = [uuid.uuid4().hex for _ in range(calls)]
            rates["engine"].append(per_second(engine_call, keys))
            rates["dbos"].append(per_second(dbos_call, keys))
            rates["engine_statements"].append(per_second(statements, [f"sql-{key}" for key in keys]))
            rates["engine_replay"].append(per_second(engine_call, keys))
            rates["dbos_replay"].append(per_second(dbos_call, keys))
        pieces = engine_pieces.measure(operation, raw, QUICK_PIECES if quick else PIECES)
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
    p3 = at_least("P3", "engine first executions/s / DBOS one-step workflows/s", ratios, 4,
                  engine_per_s=median["engine"], dbos_per_s=median["dbos"],
                  replay_ratio=statistics.median(replay_ratios),
                  engine_statements_per_s=median["engine_statements"],
                  engine_statements_ratio=statistics.median(statements_ratios),
                  engine_over_statements=statistics.median(within), allowed_beyond_statements_us=allowed_us,
                  pieces_in_a_call_us=needs_us)
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
        "Per operation the engine makes one durable commit (claim, side effect, outcome and two audit events "
        "together); a DBOS workflow records its status when it starts, the step's output, and its status when "
        "it ends.", "",
    ]), [p3])
