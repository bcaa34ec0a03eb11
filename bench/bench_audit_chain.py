"""Issue 5: what the audit hash chain costs writers, and why it is sealed afterwards.

Two ways to chain events, measured in one run on the same database:

- sealer (what idemops does): a writer's transaction only INSERTs its event;
  `audit.seal()` links committed events later under one advisory lock.
- inline: each writer takes the chain lock in its own transaction, reads the
  head, INSERTs its event and links it (the obvious design). The lock is held
  until commit, so writers queue behind each other's commits.

Each writer transaction is `record_event` alone (the smallest transaction an
audited change can be), so the figures show the chain's cost at its most
visible. Then: how fast the sealer links and how fast verification checks.

    make bench  (or: .venv/bin/python bench/run.py audit_chain)
"""

from __future__ import annotations

import sys
import time

from bench.common import concurrently, on_bench_database

WRITERS = [1, 4, 8]
EVENTS_PER_WRITER = 150
ROUNDS = 2


def run(quick: bool = False) -> str:
    from django.db import connection, connections

    from tools_app import access
    from tools_app.core import audit
    from tools_app.models import AuditEvent

    # The inline rounds below extend the chain without seals, so each run starts
    # from an empty log: only ever on the benchmarks' own cluster.
    if not on_bench_database():
        raise SystemExit("refusing to empty the audit log outside the benchmarks' own database")
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE tools_app_auditevent, tools_app_auditseal")
    writer_counts, events_per_writer, rounds = ([1, 4], 20, 1) if quick else (WRITERS, EVENTS_PER_WRITER, ROUNDS)
    tenant = access.create_tenant("bench-audit")
    audit.seal()  # start from a sealed chain

    def sealer_write(i: int) -> None:
        from django.db import transaction

        with transaction.atomic():
            audit.record_event(action="bench.event", obj=tenant, actor="system:bench", after={"i": i})

    def inline_write(i: int) -> None:
        from django.db import transaction

        with transaction.atomic():
            audit._take_seal_lock(wait=True)
            head = (AuditEvent.objects.filter(seq__isnull=False).order_by("-seq").values_list("seq", "hash").first()
                    or (0, audit.GENESIS_HASH))
            event = audit.record_event(action="bench.event", obj=tenant, actor="system:bench", after={"i": i})
            event.refresh_from_db()  # hash what the database stored, as the sealer does
            event.seq, event.prev_hash = head[0] + 1, head[1]
            event.hash = audit.event_hash(head[1], event)
            AuditEvent.objects.filter(pk=event.pk).update(seq=event.seq, prev_hash=event.prev_hash, hash=event.hash)

    def throughput(write, writers: int) -> float:
        def write_all() -> None:
            for i in range(events_per_writer):
                write(i)
            connections.close_all()

        return writers * events_per_writer / concurrently(write_all, writers)

    rows, ratios = [], []
    best: dict[tuple[str, int], float] = {}
    # Inline chaining continues the chain past the sealer's last seal, so the
    # sealer rounds (and the seal/verify figures) all come first.
    for _ in range(rounds):
        for writers in writer_counts:
            best[("sealer", writers)] = max(best.get(("sealer", writers), 0), throughput(sealer_write, writers))
    unsealed = AuditEvent.objects.filter(seq__isnull=True).count()
    started = time.perf_counter()
    audit.seal()
    seal_rate = unsealed / (time.perf_counter() - started)
    started = time.perf_counter()
    report = audit.verify_chain()
    verify_rate = report.verified / (time.perf_counter() - started)
    assert report.ok, report.broken
    for _ in range(rounds):
        for writers in writer_counts:
            best[("inline", writers)] = max(best.get(("inline", writers), 0), throughput(inline_write, writers))
    for writers in writer_counts:
        sealer, inline = best[("sealer", writers)], best[("inline", writers)]
        ratios.append(sealer / inline)
        rows.append(f"| {writers} | {sealer:,.0f} | {inline:,.0f} | {sealer / inline:.2f}× |")
    return "\n".join([
        "## Audit hash chain: sealer vs inline chaining (issue 5)",
        "",
        f"Writer transactions of one `record_event` each; {events_per_writer} per writer thread, best of {rounds} "
        "rounds. Events/s committed by all writers together.",
        "",
        "| writers | sealer design: events/s | inline chain lock: events/s | sealer / inline |",
        "| ---: | ---: | ---: | ---: |",
        *rows,
        "",
        f"- The sealer linked {unsealed:,} committed events at **{seal_rate:,.0f} events/s** "
        f"(one advisory lock, batches of {audit.SEAL_BATCH}).",
        f"- `verify_chain` checked {report.verified:,} events at **{verify_rate:,.0f} events/s**.",
        "",
    ])


if __name__ == "__main__":
    sys.exit("run it through bench/run.py: .venv/bin/python bench/run.py audit_chain")
