"""The pieces of Python every first call of a local tool needs, each timed alone (P3's section; P1).

    .venv/bin/python bench/engine_pieces.py [--number 5000]

On a fresh benchmark database, for P3's operation (bench/bench_dbos.py: a local tool, arguments `{"n": 1}`):
the operation's fingerprint, stored form and field digests; the record built (its operation id, its sealed
arguments, its lease); the record's INSERT parameters; an audit event and its parameters (a first call writes
two); the SUCCEEDED mark's UPDATE and its audit event with their parameters; and the call's span. (Django's
transaction is not among them: timed alone around one statement it took tens of µs of CPU beyond psycopg's, but in
a call it costs nothing beyond psycopg's own, as P3's section measures with the engine's statements in both.)

Each piece is timed twice: in a loop (`timeit`, the best of five repeats of `--number`), and each run right
after a round trip to the database, as a call runs it, with the processor's caches as the wait left them (the
lowest of three blocks of `--number` / 5). Their sum is Python the engine cannot do without, however it is
arranged: `make bench` prints it in P3's section beside what 4× DBOS leaves the engine over its statements
(docs/performance.md, "Where a first execution's time goes beyond its statements").
"""

from __future__ import annotations

import argparse
import sys
import time
import timeit
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import setup_django


class Piece(NamedTuple):
    what: str
    in_a_loop_us: float
    in_a_call_us: float  # each run after a round trip
    times: int = 1  # how many a first call has


def measure(operation: Callable[[str], Any], number: int) -> list[Piece]:
    """The pieces of a first call of `operation(key)` (an `engine.Operation`), each timed alone."""
    from tools_app.core import audit, clock, db, tracing
    from tools_app.engine import claims
    from tools_app.engine.models import RecordStatus

    key = uuid.uuid4().hex

    def the_operation() -> Any:
        op = operation(key)
        op.fingerprint, op.stored_arguments, op.field_digests  # noqa: B018  (each computed once, as a call does)
        return op

    op = the_operation()
    record = claims.new_record(op)
    record.pk, record.lease_owner = 1, "bench"  # as the claim leaves it: the mark names both

    def an_event() -> Any:
        event = audit.new_event(action="record.claimed", obj=record, actor=op.actor, trace_id=op.trace_id,
                                after={"status": RecordStatus.PROCESSING, "fingerprint": op.fingerprint})
        return db.insert_parts(event)

    def the_mark() -> Any:
        event = audit.new_event(action="record.succeeded", obj=record, actor=op.actor, trace_id=op.trace_id,
                                before={"status": RecordStatus.PROCESSING}, after={"status": RecordStatus.SUCCEEDED})
        changes = {"status": RecordStatus.SUCCEEDED, "result": {"ok": True}, "lease_owner": "",
                   "lease_expires_at": None, "error_class": "", "error_message": "", "finished_at": clock.NOW,
                   "updated_at": clock.NOW}
        expected = {"status": RecordStatus.PROCESSING, "lease_owner": "bench"}
        return db._update_shape(record, expected, changes, {}), db.insert_parts(event)

    def a_span() -> None:
        with tracing.span("idempotency.claim") as span:
            span.set_attribute("idemops.claimed", True)

    runs = max(number // 5, 1)  # a run after a round trip costs the round trip too: fewer of them

    def after_round_trip_us(work: Callable[[], object]) -> float:
        blocks = []
        for _ in range(3):
            spent = 0
            for _ in range(runs):
                db.fetchone("SELECT 1", [])
                started = time.perf_counter_ns()
                work()
                spent += time.perf_counter_ns() - started
            blocks.append(spent / runs / 1e3)
        return min(blocks)

    def timed(what: str, work: Callable[[], object], times: int = 1) -> Piece:
        in_a_loop = min(timeit.repeat(work, number=number, repeat=5)) / number * 1e6
        return Piece(what, in_a_loop, after_round_trip_us(work), times)

    return [
        timed("the operation: its fingerprint, stored form and field digests", the_operation),
        timed("the record built (its operation id, sealed arguments and lease)", lambda: claims.new_record(op)),
        timed("the record's INSERT parameters", lambda: db.insert_parts(record)),
        timed("an audit event and its parameters (a first call writes two)", an_event, times=2),
        timed("the SUCCEEDED mark's UPDATE and its audit event, with their parameters", the_mark),
        timed("the call's span", a_span),
    ]


def total(pieces: list[Piece]) -> tuple[float, float]:
    """The pieces' sum for one first call, in a loop and in a call (µs)."""
    return (sum(piece.in_a_loop_us * piece.times for piece in pieces),
            sum(piece.in_a_call_us * piece.times for piece in pieces))


def table(pieces: list[Piece]) -> list[str]:
    in_a_loop, in_a_call = total(pieces)
    return ["| a piece every first call needs, timed alone | µs in a loop | µs after a round trip |",
            "| --- | ---: | ---: |",
            *(f"| {piece.what} | {piece.in_a_loop_us:.1f} | {piece.in_a_call_us:.1f} |" for piece in pieces),
            f"| **their sum for one first call** | **{in_a_loop:.0f}** | **{in_a_call:.0f}** |"]


def main(number: int) -> None:
    from tools_app import access, engine

    tenant = access.create_tenant(f"bench-pieces-{uuid.uuid4().hex[:6]}")

    def operation(key: str) -> engine.Operation:
        return engine.Operation(tenant_id=tenant.pk, tool="bench", key=key, arguments={"n": 1}, actor="agent:bench/a")

    for _ in range(50):  # the statements prepared, the caches filled
        engine.run(operation(uuid.uuid4().hex), lambda record: {"ok": True})
    print("\n".join(table(measure(operation, number))))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--number", type=int, default=5000)
    options = parser.parse_args()
    setup_django()
    main(options.number)
