"""P14–P17: the big tables (issue 28 §4): 10 million idempotency records and 30 million audit events.

    make bench  (or .venv/bin/python bench/run.py big_tables); --quick: 20,000 records, 30,000 events
    BENCH_BIG_EVENTS=3000000 .venv/bin/python bench/run.py big_tables: fewer audit events (the sealer links
    about 9,000 events/s here, so 30 million take about an hour to seal and half an hour to verify)

Records are loaded as P8 loads them (bench/bench_replay_scale.py: one tenant with 1,000 records, one with
all the others, INSERT … SELECT generate_series, then ANALYZE). Audit events are written with COPY, unsealed
(the append-only trigger allows nothing else), then linked into the hash chain by the real sealer
(`audit.seal()`), so that verification checks a chain as production builds it. Then:

- P14: replay latency, big tenant / 1,000-record tenant (P8's measurement at this size; target ≤ 1.3×), with
  the records table and the index a replay reads in PostgreSQL's buffers (shared_buffers() below);
- P15–P17: the console's record list, find-by-key and record page, p95 over real HTTP against uvicorn
  serving the production ASGI app, as an operator logged in with password and authenticator code
  (target ≤ 300 ms each);
- the auditors' CSV export of the big tenant's newest million records (rows/s) and `audit.verify_chain()` (events/s).
"""

from __future__ import annotations

import os
import random
import re
import time
import uuid
from datetime import UTC, datetime, timedelta

from bench.bench_replay_scale import load, replay
from bench.common import Section, at_most, percentile, restart_setting

RECORDS, QUICK_RECORDS = 10_000_000, 20_000
EVENTS, QUICK_EVENTS = int(os.environ.get("BENCH_BIG_EVENTS", 30_000_000)), 30_000
EXPORTED = 1_000_000  # the newest rows of the big tenant, exported by a created_after filter
PAGES, QUICK_PAGES = 40, 10
P95_LIMIT_MS = 300.0
# The benchmark's cluster runs with shared_buffers big enough for what a replay reads at 10 million records
# (5.2 GB of table, 944 MB of its unique index), as docs/deploy.md advises a production server: 8 GB, or
# 40% of a smaller machine's memory (PostgreSQL's documentation: more than 40% is unlikely to help). The
# quick run restarts its cluster the same way, with less.
QUICK_SHARED_BUFFERS = "256MB"


def shared_buffers() -> str:
    memory_mb = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2**20
    return f"{min(8 * 1024, memory_mb * 2 // 5)}MB"
COPY_EVENTS = ("COPY tools_app_auditevent (tenant_id, actor, action, object_type, object_id, before, after, reason, "
               "trace_id, created_at, prev_hash, hash) FROM STDIN")


def copy_events(tenant_id: int, count: int) -> float:
    """`count` unsealed audit events of `tenant_id` by COPY; returns the seconds it took."""
    from django.db import connection

    started = time.perf_counter()
    connection.ensure_connection()
    raw = connection.connection
    with raw.cursor() as cursor, cursor.copy(COPY_EVENTS) as copy:
        for i in range(1, count + 1):
            copy.write_row((tenant_id, "agent:bench/bot", "record.succeeded" if i % 2 else "record.claimed",
                            "idempotencyrecord", str(i), '{"status": "processing"}', '{"status": "succeeded"}', "",
                            f"{i:032x}", "2026-01-01 00:00:00+00", "", ""))
    return time.perf_counter() - started


# What a replay reads: the records table and its unique index on (tenant, tool, key).
REPLAY_RELATIONS = ("tools_app_idempotencyrecord", "one_live_record_per_key")


def prewarm() -> float:
    """Load the records table and the index a replay reads into PostgreSQL's own buffers (pg_prewarm's
    'buffer' mode), and the table's other indexes into the operating system's cache ('read'), as on a
    server that has been serving and whose memory holds them; returns the seconds it took. Without it the
    first reads of each page come from disk: right after the load, a replay of a random one of 10 million
    keys read 3 to 5 pages of a 944 MB index and a 5 GB table that way (docs/performance.md). A 'read' of
    the table alone was not enough beside 30 million audit events just written and sealed: the warm-up
    read from disk again and replays still did (most likely the operating system's cache favoured the
    audit pages it had seen twice over the table's, read once)."""
    from django.db import connection

    started = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute("CREATE EXTENSION IF NOT EXISTS pg_prewarm")
        table = "'tools_app_idempotencyrecord'::regclass"
        cursor.execute(f"SELECT pg_prewarm(indexrelid, 'read') FROM pg_index WHERE indrelid = {table} "
                       "AND indexrelid <> 'one_live_record_per_key'::regclass")
        for relation in REPLAY_RELATIONS:
            cursor.execute("SELECT pg_prewarm(%s::regclass, 'buffer')", [relation])
    return time.perf_counter() - started


def held_in_buffers() -> dict[str, float]:
    """The share of each of REPLAY_RELATIONS' pages that PostgreSQL's buffers hold now (pg_buffercache)."""
    from django.db import connection

    held = {}
    with connection.cursor() as cursor:
        cursor.execute("CREATE EXTENSION IF NOT EXISTS pg_buffercache")
        for relation in REPLAY_RELATIONS:
            cursor.execute(
                "SELECT (SELECT count(*) FROM pg_buffercache WHERE relfilenode = pg_relation_filenode(%(r)s::regclass)"
                " AND reldatabase = (SELECT oid FROM pg_database WHERE datname = current_database()))::float"
                " / greatest(pg_relation_size(%(r)s::regclass) / current_setting('block_size')::int, 1)",
                {"r": relation})
            held[relation] = cursor.fetchone()[0]
    return held


def p95_ms(fetch, count: int) -> tuple[float, float]:
    """(p95, median) milliseconds of `count` calls of fetch(i), after one warm-up call."""
    fetch(0)
    times = []
    for i in range(count):
        begun = time.perf_counter()
        fetch(i)
        times.append((time.perf_counter() - begun) * 1000)
    return percentile(times, 0.95), sorted(times)[len(times) // 2]


def run(quick: bool = False) -> Section:
    with restart_setting("shared_buffers", QUICK_SHARED_BUFFERS if quick else shared_buffers()) as configured:
        return measure(quick, configured)


def measure(quick: bool, configured: bool) -> Section:
    from django.db import connection

    from bench.bench_api_csv import BenchServer, export
    from tests.support.operators import admin_session, login_for_the_web_server, make_operator
    from tools_app.access import auditors
    from tools_app.access.models import Tenant
    from tools_app.core import audit
    from tools_app.models import IdempotencyRecord

    records, events, pages = (QUICK_RECORDS, QUICK_EVENTS, QUICK_PAGES) if quick else (RECORDS, EVENTS, PAGES)
    with connection.cursor() as cursor:
        cursor.execute("SHOW shared_buffers")
        buffers = cursor.fetchone()[0]
    tenants, total, load_seconds = load(records - 1_000)
    big_id, big_rows = tenants["big"]
    big = Tenant.objects.get(pk=big_id)

    copy_seconds = copy_events(big_id, events)
    started = time.perf_counter()
    sealed = audit.seal().sealed
    seal_seconds = time.perf_counter() - started
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE tools_app_auditevent")
    warm_seconds = prewarm()

    latencies, ratios = replay(tenants, 2 if quick else 5, 100 if quick else 400)
    held = held_in_buffers()
    p14 = at_most("P14", f"replay median latency, {big_rows:,} records / 1,000 records", ratios, 1.3,
                  table_rows=total)

    operator = make_operator(f"bench-{uuid.uuid4().hex[:6]}", "operator", big)
    login_for_the_web_server(operator)
    _, raw_key = auditors.issue_key(f"bench-big-{time.time_ns()}", [big], actor="system:bench")
    rng = random.Random(28)
    keys = [f"key-{rng.randint(1, big_rows)}" for _ in range(pages + 1)]
    ids = list(IdempotencyRecord.objects.filter(tenant=big, key__in=keys).values_list("pk", flat=True))
    server = BenchServer("bench-big-tables", "idemops.settings")
    try:
        session = admin_session(server, operator.username)
        page = session.get("/admin/find/")
        csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)

        def ok(response):
            assert response.status_code == 200, (response.status_code, response.text[:300])

        list_p95, list_median = p95_ms(lambda i: ok(session.get("/admin/tools_app/idempotencyrecord/",
                                                                params={"p": str(i % 5 + 1)})), pages)
        def found(response):  # one match: the find answers with the way to the record's page
            assert response.status_code == 303, (response.status_code, response.text[:300])
            assert "/idempotencyrecord/" in response.headers["location"], response.headers["location"]

        find_p95, find_median = p95_ms(lambda i: found(session.post("/admin/find/", data={
            "csrfmiddlewaretoken": csrf, "q": keys[i], "tenant": str(big_id), "tool": "create_order"})), pages)
        page_p95, page_median = p95_ms(lambda i: ok(session.get(
            f"/admin/tools_app/idempotencyrecord/{ids[i % len(ids)]}/change/")), pages)
        # FILL writes the big tenant's record g at now() - g seconds: this range holds the newest EXPORTED.
        since = (datetime.now(UTC) - timedelta(seconds=EXPORTED)).strftime("%Y-%m-%dT%H:%M:%SZ")
        exported, size, export_seconds = export(server, "/api/v1/idempotency-records/export.csv", raw_key,
                                                {"tenant": big.slug, "created_after": since})
        session.close()  # an open keep-alive connection would hold the server's graceful shutdown
    finally:
        server.stop()

    started = time.perf_counter()
    report = audit.verify_chain()
    verify_seconds = time.perf_counter() - started
    assert report.ok, report
    figures = [
        p14,
        at_most("P15", "console record list p95, big tenant's records", [list_p95], P95_LIMIT_MS, unit=" ms"),
        at_most("P16", "console find-by-key p95, big tenant", [find_p95], P95_LIMIT_MS, unit=" ms"),
        at_most("P17", "console record page p95, big tenant", [page_p95], P95_LIMIT_MS, unit=" ms"),
    ]
    medians = {label: sorted(values)[len(values) // 2] for label, values in latencies.items()}
    return Section("\n".join([
        f"## P14–P17: {total:,} idempotency records and {events:,} audit events", "",
        f"Records loaded and analysed in {load_seconds:.0f} s (as P8 loads them: {big_rows:,} for one tenant, "
        f"1,000 for another); {events:,} audit events written by COPY in {copy_seconds:.0f} s and linked by the "
        f"real sealer ({sealed:,} events) in {seal_seconds:.0f} s. The records table and the index a replay "
        f"reads were then loaded into PostgreSQL's buffers (`pg_prewarm`, 'buffer' mode; `shared_buffers` "
        f"{buffers}{'' if configured else ', as the server was configured'}) and the table's other indexes into "
        f"the operating system's cache ('read' mode), in {warm_seconds:.0f} s: every figure below is of a warm "
        "server. After the replays PostgreSQL's buffers held "
        + " and ".join(f"{share:.0%} of `{relation}`" for relation, share in held.items()) + ".", "",
        "| measured | value |", "| --- | ---: |",
        f"| replay median, 1,000-record tenant | {medians['1k']:.3f} ms |",
        f"| replay median, {big_rows:,}-record tenant | {medians['big']:.3f} ms |",
        f"| console record list p95 (median) | {list_p95:.0f} ms ({list_median:.0f}) |",
        f"| console find-by-key p95 (median) | {find_p95:.0f} ms ({find_median:.0f}) |",
        f"| console record page p95 (median) | {page_p95:.0f} ms ({page_median:.0f}) |",
        f"| auditors' CSV export | {exported:,} rows, {size / 2**20:.1f} MiB in {export_seconds:.1f} s: "
        f"**{exported / export_seconds:,.0f} rows/s** |",
        f"| audit verification | {report.verified:,} events in {verify_seconds:.1f} s: "
        f"**{report.verified / verify_seconds:,.0f} events/s** |", "",
        f"- P14: **{p14.value:.2f}×** (rounds {p14.spread_cell()}; target ≤ 1.3×).",
        f"- P15–P17: {pages} requests each over HTTP, one operator session with its second factor; "
        "the list pages without counting the table (tools_app/admin/scoping.py).", "",
    ]), figures)
