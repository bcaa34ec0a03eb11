"""P1, P2: the engine against raw psycopg on the same database, one client.

P1 claim+complete: `engine.run` of a new key with a no-op local side effect
   (the record and its audit event, then SUCCEEDED and its audit event, one
   commit), against raw `INSERT ... ON CONFLICT DO NOTHING RETURNING id` +
   `UPDATE` (two autocommit statements):
   - on a minimal table (id, tenant, tool, key, fingerprint, status, result):
     the issue's baseline;
   - on the engine's own table, the same row the engine writes (its columns,
     JSON and indexes), parameters prepared before timing: what the record
     itself costs.
P2 replay: `engine.run` of a key already SUCCEEDED, against a raw indexed
   SELECT of the same row.
Beside each, the engine's own statements issued from raw psycopg with nothing
around them (`EngineStatements`: the texts and parameters the engine sent for
one key, captured once, sent again for each new key): what its SQL costs
alone, so that a ratio splits into the statements' part and the Python's.
The sides alternate in rounds so that machine noise hits them alike.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import statistics
import uuid
from collections.abc import Callable
from typing import Any
from unittest import mock

from bench.common import Section, at_most, live_statistics, row, spread, summary, timed

ROUNDS, QUICK_ROUNDS = 5, 2
CALLS_PER_ROUND, QUICK_CALLS = 400, 60
ENGINE_NOTE = (
    "Where the engine's time goes: a first call of a local tool is BEGIN, one statement that claims the key "
    "(it inserts the record and its audit event, or reads a live record's replay columns), the side effect (no "
    "savepoint: a failure rolls back the whole transaction and is recorded under a claim of its own), one "
    "statement that marks the record SUCCEEDED with its audit event, and one COMMIT: one durable commit where "
    "the raw baseline makes two, and four round trips where it makes two. A replay, where a tool's recent calls "
    "were mostly replays (as here), is one indexed read of the columns a replay needs; among first calls, the "
    "claim statement reads it (BEGIN, the claim, COMMIT). The raw baseline writes no audit rows "
    "(tests/engine/test_round_trips.py counts the round trips).")


class EngineStatements:
    """The statements `engine.run` sends through `core.db.fetchone` for one call, captured for two keys, and
    sent again from a raw psycopg connection for any other key: the parameters that differ between the two
    captures are the key's own (the key, its digest, the operation id, the record's id, a time), replaced by
    the new key's; the rest is sent as captured. The texts are sent as the engine sends them (numbered
    placeholders on a `RawCursor`), on a connection that prepares statements as the engine's does."""

    def __init__(self, call: Callable[[str], object], keys: tuple[str, str]) -> None:
        from tools_app.core import db

        captures: list[list[tuple[str, list[Any]]]] = []
        fetchone = db.fetchone
        for key in keys:
            sent: list[tuple[str, list[Any]]] = []

            def spy(sql: str, params: Any, sent: list[tuple[str, list[Any]]] = sent) -> Any:
                sent.append((sql, list(params)))
                return fetchone(sql, params)

            with mock.patch.object(db, "fetchone", spy):
                call(key)
            captures.append(sent)
        first, second = captures
        # Nothing captured would make the raw side an empty loop: its figure would mean nothing.
        assert first, "engine.run sent no statement through core.db.fetchone"
        assert [sql for sql, _ in first] == [sql for sql, _ in second], "the two calls sent other statements"
        self.keys = keys
        self.statements = [(db._numbered(sql) or sql, a, [i for i, (x, y) in enumerate(zip(a, b, strict=True))
                                                          if _compared(x) != _compared(y)])
                           for (sql, a), (_, b) in zip(first, second, strict=True)]

    def sender(self, raw: Any) -> Callable[[str], None]:
        """A function that sends the statements for a new key on `raw` (an autocommit connection)."""
        import psycopg

        cursor = psycopg.RawCursor(raw)
        # In one transaction as the engine's, or (one statement, a replay's read) in autocommit as the engine's.
        return self._send(lambda: raw.transaction() if len(self.statements) > 1 else contextlib.nullcontext(),
                          lambda sql, values: cursor.execute(sql, values).fetchone())

    def through_django(self) -> Callable[[str], None]:
        """A function that sends the statements for a new key as the engine sends them, with nothing of the
        engine around them: in Django's transaction (`atomic`) on Django's connection, through `core.db.fetchone`
        (its kept cursors). What the engine's Python beyond them costs is the engine's own."""
        from django.db import transaction

        from tools_app.core import db

        return self._send(lambda: transaction.atomic() if len(self.statements) > 1 else contextlib.nullcontext(),
                          db.fetchone)

    def _send(self, transaction: Callable[[], contextlib.AbstractContextManager[Any]],
              fetchone: Callable[[str, list[Any]], Any]) -> Callable[[str], None]:
        old_key = self.keys[0]

        def send(key: str) -> None:
            for_key: dict[Any, Any] = {old_key: key}  # a captured parameter -> this key's value
            record_id: int | None = None  # the claimed record's, once a statement returned it
            with transaction():
                for sql, params, varying in self.statements:
                    values = list(params)
                    for i in varying:
                        old = params[i]
                        if _compared(old) is not old:  # JSON (a ciphertext's nonce differs): sent as captured
                            continue
                        if old not in for_key:
                            for_key[old] = _for_key(old, key, record_id)
                        values[i] = for_key[old]
                    row = fetchone(sql, values)
                    if record_id is None and row is not None and isinstance(row[0], int):
                        record_id = row[0]

        return send


def raw_connection() -> Any:
    """An autocommit psycopg connection to the benchmark database, as Django's connections are set up:
    statements prepared alike, and the session in UTC (psycopg's C loader then reads a time without a zone
    conversion in Python)."""
    import psycopg
    from django.db import connection

    s = connection.settings_dict
    return psycopg.connect(dbname=s["NAME"], host=s["HOST"], user=s["USER"], autocommit=True,
                           prepare_threshold=s["OPTIONS"].get("prepare_threshold", 5), options="-c TimeZone=UTC")


def _for_key(old: Any, key: str, record_id: int | None) -> Any:
    """The value for `key` of a captured parameter that differed between the two captures."""
    if isinstance(old, uuid.UUID):
        return uuid.uuid4()
    if isinstance(old, dt.datetime):
        return dt.datetime.now(dt.UTC)
    if isinstance(old, str) and old.startswith("#"):  # the key's digest (core.keys)
        return "#" + hashlib.sha256(key.encode()).hexdigest()
    if record_id is not None and (isinstance(old, int) or (isinstance(old, str) and old.isdigit())):
        return record_id if isinstance(old, int) else str(record_id)  # the claimed record's id
    return old  # the rest (a lease owner, an advisory lock's number): as captured


def _compared(value: Any) -> Any:
    """A parameter as compared between the two captures: a JSON one by its value."""
    return getattr(value, "obj", value)


def run(quick: bool = False) -> Section:
    rounds, calls = (QUICK_ROUNDS, QUICK_CALLS) if quick else (ROUNDS, CALLS_PER_ROUND)
    from tools_app import access, engine
    from tools_app.core import db
    from tools_app.models import IdempotencyRecord

    tenant = access.create_tenant("bench")
    raw = raw_connection()
    raw.execute("CREATE TABLE IF NOT EXISTS bench_raw_claims (id bigserial PRIMARY KEY, tenant_id bigint, "
                "tool text, key text, fingerprint text, status text, result jsonb, UNIQUE (tenant_id, tool, key))")

    def operation(key: str) -> engine.Operation:
        return engine.Operation(tenant_id=tenant.pk, tool="bench", key=key,
                                arguments={"customer": "ACME", "items": [{"sku": "A", "quantity": 1}]},
                                actor="agent:bench/a")

    def engine_claim(key: str) -> None:
        engine.run(operation(key), lambda record: {"ok": True})

    def raw_claim(key: str) -> None:
        rid = raw.execute("INSERT INTO bench_raw_claims (tenant_id, tool, key, fingerprint, status) "
                          "VALUES (%s, 'bench', %s, %s, 'processing') ON CONFLICT DO NOTHING RETURNING id",
                          [tenant.pk, key, "f" * 64]).fetchone()[0]
        raw.execute("UPDATE bench_raw_claims SET status = 'succeeded', result = %s WHERE id = %s "
                    "AND status = 'processing'", ['{"ok": true}', rid])

    full_rows: dict[str, db.InsertParts] = {}
    table = db.table(IdempotencyRecord)

    def raw_full_claim(key: str) -> None:
        columns, values, params, _ = full_rows[key]
        rid = raw.execute(f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join(values)}) "
                          "ON CONFLICT DO NOTHING RETURNING id", params).fetchone()[0]
        raw.execute(f"UPDATE {table} SET status = 'succeeded', result = %s, lease_owner = '', "
                    "lease_expires_at = NULL, finished_at = now(), updated_at = now() "
                    "WHERE id = %s AND status = 'processing'", ['{"ok": true}', rid])

    def engine_replay(key: str) -> None:
        outcome = engine.run(operation(key), lambda record: {"ok": True})
        assert outcome.replayed

    def raw_select(key: str) -> None:
        raw.execute(f"SELECT id, status, fingerprint, result FROM {table} "
                    "WHERE tenant_id = %s AND tool = 'bench' AND key = %s AND retired_at IS NULL",
                    [tenant.pk, key]).fetchone()

    for i in range(calls):  # a warm server: the tables hold calls and have statistics
        engine_claim(f"warm-{i}")
        raw_claim(f"warm-{i}")
    live_statistics()
    # The engine's own statements, captured as it sends them among first calls, then among replays.
    claim_statements = EngineStatements(engine_claim, ("captured-a", "captured-b")).sender(raw)
    for _ in range(2):
        for i in range(40):
            engine_replay(f"warm-{i}")
    replay_statements = EngineStatements(engine_replay, ("warm-0", "warm-1")).sender(raw)
    steps = {"raw_claim": raw_claim, "raw_full_claim": raw_full_claim, "engine_sql_claim": claim_statements,
             "engine_claim": engine_claim, "raw_select": raw_select, "engine_sql_replay": replay_statements,
             "engine_replay": engine_replay}
    latencies: dict[str, list[float]] = {name: [] for name in steps}
    per_round: dict[str, list[float]] = {"claim": [], "replay": [], "claim_sql": [], "replay_sql": []}
    for _ in range(rounds):
        prefix = uuid.uuid4().hex[:8]
        for i in range(calls):
            full_rows[f"full-{prefix}-{i}"] = db.insert_parts(engine.new_record(operation(f"full-{prefix}-{i}")))
        this_round = {}
        for name, step in steps.items():
            # The raw statements' replays read the rows their claims wrote (the engine's, its own).
            key_prefix = {"raw_full_claim": f"full-{prefix}", "engine_sql_claim": f"sql-{prefix}",
                          "engine_sql_replay": f"sql-{prefix}"}.get(name, prefix)
            this_round[name] = timed(lambda i, step=step, key_prefix=key_prefix: step(f"{key_prefix}-{i}"), calls)
            latencies[name] += this_round[name]
        medians = {name: statistics.median(values) for name, values in this_round.items()}
        per_round["claim"].append(medians["engine_claim"] / medians["raw_claim"])
        per_round["replay"].append(medians["engine_replay"] / medians["raw_select"])
        per_round["claim_sql"].append(medians["engine_sql_claim"] / medians["raw_claim"])
        per_round["replay_sql"].append(medians["engine_sql_replay"] / medians["raw_select"])
    stats = {name: summary(values) for name, values in latencies.items()}

    def ratio(a: str, b: str) -> float:
        return stats[a]["median_ms"] / stats[b]["median_ms"]

    p1 = at_most("P1", "engine claim+complete / raw INSERT … ON CONFLICT + UPDATE (minimal table)", per_round["claim"],
                 2, engine_ms=stats["engine_claim"]["median_ms"], raw_ms=stats["raw_claim"]["median_ms"],
                 raw_engine_table_ms=stats["raw_full_claim"]["median_ms"],
                 engine_statements_ms=stats["engine_sql_claim"]["median_ms"],
                 engine_statements_ratio=statistics.median(per_round["claim_sql"]))
    p2 = at_most("P2", "engine replay / raw indexed SELECT", per_round["replay"], 1.5,
                 engine_ms=stats["engine_replay"]["median_ms"], raw_ms=stats["raw_select"]["median_ms"],
                 engine_statements_ms=stats["engine_sql_replay"]["median_ms"],
                 engine_statements_ratio=statistics.median(per_round["replay_sql"]))
    return Section("\n".join([
        "## P1, P2: the idempotency engine vs raw SQL",
        "",
        f"One client, {rounds} rounds × {calls} calls per path, the paths alternating; each round gives a "
        "ratio of medians, the figure is their median.",
        "",
        "| Path | median ms | p99 ms | calls/s |",
        "| --- | ---: | ---: | ---: |",
        row("raw INSERT … ON CONFLICT + UPDATE, minimal table", stats["raw_claim"]),
        row("raw INSERT … ON CONFLICT + UPDATE, the engine's table and row", stats["raw_full_claim"]),
        row("the engine's statements alone: BEGIN, claim, complete, COMMIT", stats["engine_sql_claim"]),
        row("engine claim + complete (with both audit events)", stats["engine_claim"]),
        row("raw indexed SELECT", stats["raw_select"]),
        row("the engine's replay statement alone", stats["engine_sql_replay"]),
        row("engine replay", stats["engine_replay"]),
        "",
        f"- P1 claim+complete: engine / raw on a minimal table = **{p1.value:.2f}×** (rounds {p1.spread_cell()}; "
        f"target ≤ 2×); engine / raw on the engine's own table = "
        f"**{ratio('engine_claim', 'raw_full_claim'):.2f}×**; the record alone / minimal = "
        f"{ratio('raw_full_claim', 'raw_claim'):.2f}×",
        f"- P2 replay: engine / raw SELECT = **{p2.value:.2f}×** (rounds {p2.spread_cell()}; target ≤ 1.5×)",
        f"- The engine's statements sent raw (its SQL without its Python) / the same baseline: claim + complete "
        f"**{statistics.median(per_round['claim_sql']):.2f}×** (rounds {spread(per_round['claim_sql'])}), replay "
        f"**{statistics.median(per_round['replay_sql']):.2f}×** (rounds {spread(per_round['replay_sql'])}); the "
        f"engine / its statements: claim + complete {ratio('engine_claim', 'engine_sql_claim'):.2f}×, replay "
        f"{ratio('engine_replay', 'engine_sql_replay'):.2f}× (its Python: the key's digest and the arguments' "
        "fingerprint, the record built and sealed, the answer). "
        + ("The statements alone above 2× put P1's target out of reach of the statements a first call needs. "
           if statistics.median(per_round["claim_sql"]) > 2 else "")
        + ("The replay statement alone above 1.5× puts P2's target out of reach of the read a replay needs. "
           if statistics.median(per_round["replay_sql"]) > 1.5 else "")
        + "Proposed instead (docs/performance.md): for P1 the engine's first call / its statements ≤ 1.5×, for P2 "
          "the engine's replay / its statement ≤ 1.5×.",
        "",
        ENGINE_NOTE,
        "",
    ]), [p1, p2])
