"""Issue 2 (a), (b): the engine against raw psycopg on the same database, one client.

(a) claim+complete: `idempotency.run` of a new key with a no-op side effect,
    vs raw `INSERT ... ON CONFLICT DO NOTHING RETURNING id` + `UPDATE`.
(b) replay: `idempotency.run` of a key already SUCCEEDED, vs a raw indexed
    SELECT of the same row.
Both sides alternate in rounds so that machine noise hits them alike.
"""

from __future__ import annotations

import uuid

from bench.common import row, summary, timed

ROUNDS = 5
CALLS_PER_ROUND = 400


def run() -> str:
    import psycopg
    from django.db import connection

    from tools_app import idempotency, tenants
    from tools_app.models import Tenant

    tenant = Tenant.objects.filter(slug="bench").first() or tenants.create_tenant("bench")
    s = connection.settings_dict
    raw = psycopg.connect(dbname=s["NAME"], host=s["HOST"], user=s["USER"], autocommit=True)
    raw.execute("CREATE TABLE IF NOT EXISTS bench_raw_claims (id bigserial PRIMARY KEY, tenant_id bigint, "
                "tool text, key text, fingerprint text, status text, result jsonb, UNIQUE (tenant_id, tool, key))")

    def operation(key: str) -> idempotency.Operation:
        return idempotency.Operation(tenant_id=tenant.pk, tool="bench", key=key,
                                     arguments={"customer": "ACME", "items": [{"sku": "A", "quantity": 1}]},
                                     actor="agent:bench/a")

    def engine_claim(key: str) -> None:
        idempotency.run(operation(key), lambda record: {"ok": True})

    def raw_claim(key: str) -> None:
        rid = raw.execute("INSERT INTO bench_raw_claims (tenant_id, tool, key, fingerprint, status) "
                          "VALUES (%s, 'bench', %s, %s, 'PROCESSING') ON CONFLICT DO NOTHING RETURNING id",
                          [tenant.pk, key, "f" * 64]).fetchone()[0]
        raw.execute("UPDATE bench_raw_claims SET status = 'SUCCEEDED', result = %s WHERE id = %s "
                    "AND status = 'PROCESSING'", ['{"ok": true}', rid])

    def engine_replay(key: str) -> None:
        outcome = idempotency.run(operation(key), lambda record: {"ok": True})
        assert outcome.replayed

    def raw_select(key: str) -> None:
        raw.execute("SELECT id, status, fingerprint, result FROM tools_app_idempotencyrecord "
                    "WHERE tenant_id = %s AND tool = 'bench' AND key = %s AND retired_at IS NULL",
                    [tenant.pk, key]).fetchone()

    latencies: dict[str, list[float]] = {name: [] for name in ("raw_claim", "engine_claim", "raw_select",
                                                                "engine_replay")}
    for _ in range(ROUNDS):
        prefix = uuid.uuid4().hex[:8]
        for name, step in (("raw_claim", raw_claim), ("engine_claim", engine_claim), ("raw_select", raw_select),
                           ("engine_replay", engine_replay)):
            latencies[name] += timed(lambda i, step=step, prefix=prefix: step(f"{prefix}-{i}"), CALLS_PER_ROUND)
    stats = {name: summary(values) for name, values in latencies.items()}
    claim_ratio = stats["engine_claim"]["median_ms"] / stats["raw_claim"]["median_ms"]
    replay_ratio = stats["engine_replay"]["median_ms"] / stats["raw_select"]["median_ms"]
    return "\n".join([
        "## Idempotency engine vs raw SQL (issue 2 a, b)",
        "",
        f"One client, {ROUNDS} rounds × {CALLS_PER_ROUND} calls, the two sides alternating.",
        "",
        "| Path | median ms | p99 ms | calls/s |",
        "| --- | ---: | ---: | ---: |",
        row("raw INSERT … ON CONFLICT + UPDATE", stats["raw_claim"]),
        row("engine claim + complete (with audit events)", stats["engine_claim"]),
        row("raw indexed SELECT", stats["raw_select"]),
        row("engine replay", stats["engine_replay"]),
        "",
        f"- (a) claim+complete: engine / raw = **{claim_ratio:.2f}×** (target ≤ 1.5×)",
        f"- (b) replay: engine / raw SELECT = **{replay_ratio:.2f}×** (target ≤ 1.5×)",
        "",
    ])
