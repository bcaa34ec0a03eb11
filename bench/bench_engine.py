"""Issue 2 (a), (b): the engine against raw psycopg on the same database, one client.

(a) claim+complete: `engine.run` of a new key with a no-op side effect
    (one INSERT of the record and its audit event, then one UPDATE to
    SUCCEEDED with its audit event, two commits), against raw
    `INSERT ... ON CONFLICT DO NOTHING RETURNING id` + `UPDATE`:
    - on a minimal table (id, tenant, tool, key, fingerprint, status, result):
      the issue's baseline;
    - on the engine's own table, the same row the engine writes (its columns,
      JSON and seven indexes), parameters prepared before timing: what the
      record itself costs, so the rest is what the engine adds.
(b) replay: `engine.run` of a key already SUCCEEDED, against a raw
    indexed SELECT of the same row.
The sides alternate in rounds so that machine noise hits them alike.
"""

from __future__ import annotations

import uuid

from bench.common import row, summary, timed

ROUNDS = 5
CALLS_PER_ROUND = 400
ENGINE_NOTE = (
    "Where the engine's time goes: a claim is one indexed read (so a replay stops there), then one statement "
    "that inserts the record and its audit event; completing is one statement that updates the record and "
    "inserts its audit event, inside a transaction (so a local side effect commits with it: BEGIN and COMMIT "
    "are round trips of their own). The raw baseline writes neither audit row, reads nothing first and runs "
    "without a transaction. The record's own width and seven indexes cost the raw path about 1.2×; the rest is "
    "the two audit rows, the extra round trips and Django/psycopg work per statement. Replay and the raw "
    "SELECT are both a fraction of a millisecond, so their ratio moves with machine noise from run to run.")


def run() -> str:
    import psycopg
    from django.db import connection

    from tools_app import access, engine
    from tools_app.core import db
    from tools_app.models import IdempotencyRecord

    tenant = access.create_tenant("bench")
    s = connection.settings_dict
    raw = psycopg.connect(dbname=s["NAME"], host=s["HOST"], user=s["USER"], autocommit=True)
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
                          "VALUES (%s, 'bench', %s, %s, 'PROCESSING') ON CONFLICT DO NOTHING RETURNING id",
                          [tenant.pk, key, "f" * 64]).fetchone()[0]
        raw.execute("UPDATE bench_raw_claims SET status = 'SUCCEEDED', result = %s WHERE id = %s "
                    "AND status = 'PROCESSING'", ['{"ok": true}', rid])

    full_rows: dict[str, tuple[list[str], list[str], list]] = {}
    table = db.table(IdempotencyRecord)

    def raw_full_claim(key: str) -> None:
        columns, values, params = full_rows[key]
        rid = raw.execute(f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join(values)}) "
                          "ON CONFLICT DO NOTHING RETURNING id", params).fetchone()[0]
        raw.execute(f"UPDATE {table} SET status = 'SUCCEEDED', result = %s, lease_owner = '', "
                    "lease_expires_at = NULL, finished_at = now(), updated_at = now() "
                    "WHERE id = %s AND status = 'PROCESSING'", ['{"ok": true}', rid])

    def engine_replay(key: str) -> None:
        outcome = engine.run(operation(key), lambda record: {"ok": True})
        assert outcome.replayed

    def raw_select(key: str) -> None:
        raw.execute(f"SELECT id, status, fingerprint, result FROM {table} "
                    "WHERE tenant_id = %s AND tool = 'bench' AND key = %s AND retired_at IS NULL",
                    [tenant.pk, key]).fetchone()

    steps = {"raw_claim": raw_claim, "raw_full_claim": raw_full_claim, "engine_claim": engine_claim,
             "raw_select": raw_select, "engine_replay": engine_replay}
    latencies: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(ROUNDS):
        prefix = uuid.uuid4().hex[:8]
        for i in range(CALLS_PER_ROUND):
            full_rows[f"full-{prefix}-{i}"] = db.insert_parts(engine.new_record(operation(f"full-{prefix}-{i}")))
        for name, step in steps.items():
            key_prefix = f"full-{prefix}" if name == "raw_full_claim" else prefix
            latencies[name] += timed(lambda i, step=step, key_prefix=key_prefix: step(f"{key_prefix}-{i}"),
                                     CALLS_PER_ROUND)
    stats = {name: summary(values) for name, values in latencies.items()}

    def ratio(a: str, b: str) -> float:
        return stats[a]["median_ms"] / stats[b]["median_ms"]

    return "\n".join([
        "## Idempotency engine vs raw SQL (issue 2 a, b)",
        "",
        f"One client, {ROUNDS} rounds × {CALLS_PER_ROUND} calls per path, the paths alternating.",
        "",
        "| Path | median ms | p99 ms | calls/s |",
        "| --- | ---: | ---: | ---: |",
        row("raw INSERT … ON CONFLICT + UPDATE, minimal table", stats["raw_claim"]),
        row("raw INSERT … ON CONFLICT + UPDATE, the engine's table and row", stats["raw_full_claim"]),
        row("engine claim + complete (with both audit events)", stats["engine_claim"]),
        row("raw indexed SELECT", stats["raw_select"]),
        row("engine replay", stats["engine_replay"]),
        "",
        f"- (a) claim+complete: engine / raw on a minimal table = **{ratio('engine_claim', 'raw_claim'):.2f}×** "
        f"(target ≤ 1.5×); engine / raw on the engine's own table = "
        f"**{ratio('engine_claim', 'raw_full_claim'):.2f}×**; the record alone / minimal = "
        f"{ratio('raw_full_claim', 'raw_claim'):.2f}×",
        f"- (b) replay: engine / raw SELECT = **{ratio('engine_replay', 'raw_select'):.2f}×** (target ≤ 1.5×)",
        "",
        ENGINE_NOTE,
        "",
    ])
