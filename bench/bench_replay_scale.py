"""P8: replay latency with a million records vs a thousand.

Two tenants, one with 1,000 SUCCEEDED records and one with 1,000,000 (loaded in one INSERT …
SELECT generate_series, then ANALYZE), all in the one records table with its indexes. Then
`engine.run` replays random keys of each tenant, the two alternating call by call, one client.
P8 = the median replay latency at 1M / at 1k.
"""

from __future__ import annotations

import random
import statistics
import time
import uuid

from bench.common import Section, at_most, percentile

BIG, QUICK_BIG = 1_000_000, 20_000
SMALL = 1_000
ROUNDS, QUICK_ROUNDS = 5, 2
CALLS, QUICK_CALLS = 400, 100
ARGUMENTS = {"customer": "ACME", "items": [{"sku": "BOLT-1", "quantity": 3}]}

FILL = """
INSERT INTO tools_app_idempotencyrecord
    (tenant_id, tool, key, fingerprint, field_digests, arguments, status, result, error_class, error_message,
     attempts, lease_owner, operation_id, trace_id, actor, created_at, updated_at, finished_at, expires_at,
     downstream_key, evidence, reconcile_attempts, span_id, fingerprint_version, ongoing, uncertain_runs)
SELECT %(tenant)s, 'create_order', 'key-' || g, %(fingerprint)s, %(digests)s::jsonb, %(arguments)s::jsonb,
       'succeeded', jsonb_build_object('order_id', g), '', '', 1, '', gen_random_uuid(), '', 'agent:bench/bot',
       now() - g * interval '1 second', now(), now(), now() + interval '30 days', '', '[]'::jsonb, 0, '',
       %(version)s, false, 0
FROM generate_series(1, %(rows)s) AS g
"""


def operation(tenant_id: int, key: str):  # -> engine.Operation (imported after Django's setup)
    from tools_app import engine

    return engine.Operation(tenant_id=tenant_id, tool="create_order", key=key, arguments=ARGUMENTS,
                            actor="agent:bench/bot")


def load(big: int) -> tuple[dict[str, tuple[int, int]], int, float]:
    """Two tenants, SMALL records and `big` records: ({"1k"|"big": (tenant id, rows)}, table rows, seconds)."""
    import json

    from django.db import connection

    from tools_app import access

    sample = operation(0, "x")
    tenants = {}
    started = time.perf_counter()
    for label, rows in (("1k", SMALL), ("big", big)):
        tenant = access.create_tenant(f"bench-scale-{label}-{uuid.uuid4().hex[:6]}")
        with connection.cursor() as cursor:
            cursor.execute(FILL, {"tenant": tenant.pk, "rows": rows, "fingerprint": sample.fingerprint,
                                  "digests": json.dumps(sample.field_digests), "arguments": json.dumps(ARGUMENTS),
                                  "version": sample.fingerprint_version})
        tenants[label] = (tenant.pk, rows)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE tools_app_idempotencyrecord")
        cursor.execute("SELECT count(*) FROM tools_app_idempotencyrecord")
        total = cursor.fetchone()[0]
    return tenants, total, time.perf_counter() - started


def replay(tenants: dict[str, tuple[int, int]], rounds: int, calls: int) -> tuple[dict[str, list[float]], list[float]]:
    """Replays of random keys of each tenant, alternating call by call: (latencies ms by tenant, per-round
    ratios of the big tenant's median to the small one's)."""
    from tools_app import engine

    rng = random.Random(14)
    latencies: dict[str, list[float]] = {"1k": [], "big": []}
    ratios = []
    for _ in range(rounds):
        this_round: dict[str, list[float]] = {"1k": [], "big": []}
        for _ in range(calls):
            for label, (tenant_id, rows) in tenants.items():
                op = operation(tenant_id, f"key-{rng.randint(1, rows)}")
                begun = time.perf_counter()
                outcome = engine.run(op, lambda record: {"never": "executed"})
                this_round[label].append((time.perf_counter() - begun) * 1000)
                assert outcome.replayed and outcome.error is None, outcome.error
        for label, values in this_round.items():
            latencies[label] += values
        ratios.append(statistics.median(this_round["big"]) / statistics.median(this_round["1k"]))
    return latencies, ratios


def run(quick: bool = False) -> Section:
    big, rounds, calls = (QUICK_BIG, QUICK_ROUNDS, QUICK_CALLS) if quick else (BIG, ROUNDS, CALLS)
    tenants, total, load_seconds = load(big)
    latencies, ratios = replay(tenants, rounds, calls)
    medians = {label: statistics.median(values) for label, values in latencies.items()}
    p8 = at_most("P8", f"replay median latency, {big:,} records / 1,000 records", ratios, 1.3,
                 small_ms=medians["1k"], big_ms=medians["big"], big_records=big, table_rows=total)
    return Section("\n".join([
        f"## P8: replays with {big:,} records vs 1,000", "",
        f"{total:,} records in the table ({big:,} for one tenant, {SMALL:,} for another), loaded and analysed in "
        f"{load_seconds:.0f} s. One client replays random keys of each tenant, alternating call by call; "
        f"{rounds} rounds of {calls} calls per tenant.", "",
        "| tenant's records | median ms | p99 ms |", "| ---: | ---: | ---: |",
        f"| {SMALL:,} | {medians['1k']:.3f} | {percentile(latencies['1k'], 0.99):.3f} |",
        f"| {big:,} | {medians['big']:.3f} | {percentile(latencies['big'], 0.99):.3f} |", "",
        f"- P8: {big:,} / 1,000 = **{p8.value:.2f}×** (rounds {p8.spread_cell()}; target ≤ 1.3×). A replay is "
        "one read through the unique index on (tenant, tool, key): its depth grows with the log of the rows.", "",
    ]), [p8])
