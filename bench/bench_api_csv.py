"""Benchmark: peak memory of the web server during CSV exports, streamed vs built whole.

    make bench  (or .venv/bin/python bench/run.py api_csv; BENCH_CSV_ROWS=1000000 sets the big export)

Loads three tenants with 10k, 100k and BENCH_CSV_ROWS idempotency records into
the benchmark database, then for each export starts a
fresh uvicorn process (the production ASGI app), warms it up with a small
export, and reads the whole CSV over HTTP. The server's peak RSS (VmHWM from
/proc) before and after the export gives the memory the export cost.

The comparison is the same endpoint, filters and serializer with the CSV
built whole in memory and returned as one response (bench/naive_settings.py, bench/naive_urls.py),
for the two smaller tenants.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import httpx2
from django.db import connection

from tests.support.processes import Service, child_env, free_port
from tools_app.access import auditors, tenants
from tools_app.models import Tenant

FILL_SQL = """
INSERT INTO tools_app_idempotencyrecord
    (tenant_id, tool, key, fingerprint, field_digests, arguments, status, result, error_class, error_message,
     attempts, lease_owner, operation_id, trace_id, actor, created_at, updated_at, finished_at, expires_at,
     downstream_key, evidence, reconcile_attempts, span_id, fingerprint_version, ongoing, uncertain_runs)
SELECT %(tenant)s, 'create_order', 'order-' || g, md5(g::text) || md5((g + 1)::text),
       '{"currency": "x", "customer": "y", "items": "z"}'::jsonb,
       jsonb_build_object('customer', 'Customer ' || g, 'currency', 'EUR'),
       CASE WHEN g %% 10 = 0 THEN 'failed' ELSE 'succeeded' END, '{"order_id": 1}'::jsonb,
       CASE WHEN g %% 10 = 0 THEN 'transient' ELSE '' END, '', 1, '', gen_random_uuid(), 'trace-' || g,
       'agent:bench/bot', now() - g * interval '1 second', now(), now(), now() + interval '1 day',
       '', '[]'::jsonb, 0, '', 2, false, 0
FROM generate_series(1, %(rows)s) AS g
"""


def fill(slug: str, rows: int) -> Tenant:
    tenant = tenants.create_tenant(slug)
    with connection.cursor() as cursor:
        cursor.execute(FILL_SQL, {"tenant": tenant.pk, "rows": rows})
    return tenant


def peak_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise RuntimeError("no VmHWM")


def export(server: Service, path: str, raw_key: str, params: dict) -> tuple[int, int, float]:
    """Read the whole export, keeping nothing: (rows, bytes, seconds)."""
    lines = size = 0
    started = time.perf_counter()
    with httpx2.Client(base_url=server.base_url, timeout=600) as http, http.stream(
            "GET", path, params=params, headers={"Authorization": f"Bearer {raw_key}"}) as response:
        response.raise_for_status()
        for chunk in response.iter_bytes():
            lines += chunk.count(b"\n")
            size += len(chunk)
    return lines - 1, size, time.perf_counter() - started


class BenchServer(Service):
    """uvicorn serving the production ASGI app under the given settings module."""

    def __init__(self, name: str, settings_module: str):
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        env = {**child_env(IDEMOPS_PUBLIC_URL=self.base_url), "DJANGO_SETTINGS_MODULE": settings_module}
        super().__init__(name, [sys.executable, "-m", "uvicorn", "idemops.asgi:application", "--host", "127.0.0.1",
                                "--port", str(self.port), "--no-access-log"], env)
        self.wait_http(f"{self.base_url}/healthz")


def measure(kind: str, tenant: Tenant, raw_key: str) -> dict:
    if kind == "streamed":
        server = BenchServer("bench-streamed", "idemops.settings")
        path = "/api/v1/idempotency-records/export.csv"
    else:
        server = BenchServer("bench-built-whole", "bench.naive_settings")
        path = "/api/v1/idempotency-records/naive-export.csv"
    try:
        export(server, path, raw_key, {"tenant": tenant.slug, "created_after": "2999-01-01T00:00:00Z"})  # warm up
        before = peak_rss_kib(server.process.pid)
        rows, size, seconds = export(server, path, raw_key, {"tenant": tenant.slug})
        after = peak_rss_kib(server.process.pid)
    finally:
        server.stop()
    return {"kind": kind, "rows": rows, "mib": size / 2**20, "seconds": seconds,
            "before": before / 1024, "after": after / 1024, "growth": (after - before) / 1024}


def run(quick: bool = False) -> str:
    sizes = {"bench-10k": 10_000, "bench-100k": 100_000, "bench-big": int(os.environ.get("BENCH_CSV_ROWS", 1_000_000))}
    if quick:  # the same code at small sizes, and no third export (each export starts a server)
        sizes = {"bench-10k": 1_000, "bench-100k": 5_000}
    started = time.perf_counter()
    loaded = {slug: fill(slug, rows) for slug, rows in sizes.items()}
    load_seconds = time.perf_counter() - started
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE tools_app_idempotencyrecord")

    results = []
    for slug, tenant in loaded.items():
        _, raw_key = auditors.issue_key(f"bench-{slug}-{time.time_ns()}", [tenant], actor="system:bench")
        results.append(measure("streamed", tenant, raw_key))
        if sizes[slug] <= 100_000:
            results.append(measure("built whole", tenant, raw_key))

    lines = ["## CSV export: server peak memory, streamed vs built whole (issue 6)", "",
             f"Rows loaded in {load_seconds:.0f} s. One fresh uvicorn process per export; peak RSS is the "
             "process's VmHWM after a warm-up export, then after the measured one. \"Built whole\" is the same "
             "endpoint, filters and serializer returning one response (bench/naive_settings.py).", "",
             "| export | rows | CSV size (MiB) | time (s) | rows/s | peak RSS before (MiB) | peak RSS after (MiB) "
             "| growth (MiB) |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in results:
        lines.append(f"| {r['kind']} | {r['rows']:,} | {r['mib']:.1f} | {r['seconds']:.1f} | "
                     f"{r['rows'] / r['seconds']:,.0f} | {r['before']:.1f} | {r['after']:.1f} | {r['growth']:.1f} |")
    streamed = {r["rows"]: r["growth"] for r in results if r["kind"] == "streamed"}
    whole = {r["rows"]: r["growth"] for r in results if r["kind"] == "built whole"}
    big, small, middle = max(streamed), sizes["bench-10k"], sizes["bench-100k"]
    lines += ["", f"- Streamed: {big:,} rows grew the server by **{streamed[big]:.1f} MiB**, vs "
                  f"{streamed[small]:.1f} MiB for {small:,} rows (constant memory).",
              f"- Built whole: {middle:,} rows cost {whole[middle]:.1f} MiB, "
              f"{whole[middle] / max(whole[small], 0.1):.1f}× the {small:,}-row figure.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit("run it through bench/run.py: .venv/bin/python bench/run.py api_csv")
