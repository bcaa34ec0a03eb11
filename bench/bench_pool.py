"""P12: Django's psycopg connection pool against persistent connections, in one web-like process.

A process runs THREADS threads (as a web process runs IDEMOPS_MCP_DB_THREADS database threads), each
serving requests one after another: a request replays a stored call (`engine.run` of a finished key:
one indexed read) between `close_old_connections()` calls, as Django wraps every request. Three ways
to hold connections, each in a fresh process:

- persistent: each thread keeps its own connection (IDEMOPS_DB_CONN_MAX_AGE_SECONDS=600, the default);
- pool: the threads share POOL_SIZE connections (IDEMOPS_DB_POOL_MAX_SIZE), taking one per request;
- none: a new connection per request (IDEMOPS_DB_CONN_MAX_AGE_SECONDS=0, no pool), for scale.

P12 = the pool's requests/s / the persistent connections' requests/s, the median of the rounds; the
table also gives the server connections each way used.
"""

from __future__ import annotations

import multiprocessing
import os
import statistics
import uuid

from bench.common import Section, at_least, concurrently

THREADS = 16
POOL_SIZE = 4
REQUESTS, QUICK_REQUESTS = 150, 20
ROUNDS, QUICK_ROUNDS = 3, 1
MODES = {
    "persistent": {"IDEMOPS_DB_CONN_MAX_AGE_SECONDS": "600", "IDEMOPS_DB_POOL_MAX_SIZE": "0"},
    "pool": {"IDEMOPS_DB_CONN_MAX_AGE_SECONDS": "600", "IDEMOPS_DB_POOL_MAX_SIZE": str(POOL_SIZE)},
    "none": {"IDEMOPS_DB_CONN_MAX_AGE_SECONDS": "0", "IDEMOPS_DB_POOL_MAX_SIZE": "0"},
}


def serve(mode: str, tenant_id: int, key: str, requests: int) -> tuple[float, int]:
    """In a fresh process: THREADS threads each serve `requests` replays; (requests/s, server connections used)."""
    os.environ.update(MODES[mode])
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "idemops.settings")
    django.setup()
    from django.db import close_old_connections, connection

    from tools_app import engine

    operation = engine.Operation(tenant_id=tenant_id, tool="bench", key=key, arguments={"n": 0},
                                 actor="agent:bench/pool")
    backends: set[int] = set()

    def serve_requests() -> None:
        try:
            for _ in range(requests):
                close_old_connections()  # request_started
                outcome = engine.run(operation, lambda record: {"ok": True})
                assert outcome.replayed, "a replay was expected"
                backends.add(connection.connection.info.backend_pid)
                close_old_connections()  # request_finished: the pool takes its connection back here
        finally:
            connection.close()

    elapsed = concurrently(serve_requests, THREADS)
    return THREADS * requests / elapsed, len(backends)


def run(quick: bool = False) -> Section:
    from tools_app import access, engine

    tenant = access.create_tenant(f"bench-pool-{uuid.uuid4().hex[:6]}")
    key = f"pool-{uuid.uuid4().hex[:8]}"
    engine.run(engine.Operation(tenant_id=tenant.pk, tool="bench", key=key, arguments={"n": 0},
                                actor="agent:bench/pool"), lambda record: {"ok": True})
    requests, rounds = (QUICK_REQUESTS, QUICK_ROUNDS) if quick else (REQUESTS, ROUNDS)
    spawn = multiprocessing.get_context("spawn")
    measured: dict[str, list[tuple[float, int]]] = {mode: [] for mode in MODES}
    for _ in range(rounds):
        for mode in MODES:  # interleaved, so the machine's load falls on each alike
            with spawn.Pool(1) as pool:
                measured[mode].append(pool.apply(serve, (mode, tenant.pk, key, requests)))
    rates = {mode: [rate for rate, _ in rounds_] for mode, rounds_ in measured.items()}
    ratios = [pool / persistent for pool, persistent in zip(rates["pool"], rates["persistent"], strict=True)]
    p12 = at_least("P12", f"Django's psycopg pool ({POOL_SIZE} connections) / persistent connections (one per "
                   f"thread), requests/s of {THREADS} threads", ratios, 0.8,
                   **{f"{mode}_per_s": statistics.median(values) for mode, values in rates.items()})
    rows = [f"| {mode} | {statistics.median(rates[mode]):,.0f} | {max(used for _, used in measured[mode])} |"
            for mode in MODES]
    return Section("\n".join([
        "## P12: Django's connection pool against persistent connections", "",
        f"One process, {THREADS} threads each serving {requests} requests (a replay: one indexed read, between "
        "`close_old_connections()` calls as Django wraps a request), each way in a fresh process, "
        f"{rounds} round{'s' if rounds > 1 else ''} interleaved{' (quick mode)' if quick else ''}.", "",
        "| connections | requests/s | server connections used |", "| --- | ---: | ---: |", *rows, "",
        f"- P12: pool / persistent = **{p12.value:.2f}×** (target ≥ 0.8×).", "",
    ]), [p12])
