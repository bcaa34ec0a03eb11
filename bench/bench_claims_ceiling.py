"""The ceiling one database sets: write claims per second with 1, 2, 4 … processes at once.

Each process (its own Python, its own connection, as a web worker would be) runs `engine.run`
of new keys with a no-op side effect for a fixed time: a claim (the record and its audit event
in one statement) and its completion (the update and its audit event), committed. Adding
processes raises the total until the database (its CPU, its WAL flushes) is the limit; the
total where it stops rising is the ceiling of claims/s for this machine. On one machine the
processes and PostgreSQL share the cores, so the ceiling measured here is a floor of what a
separate database server gives.

`run(quick=True)`: 1 and 2 processes for 2 s each.
"""

from __future__ import annotations

import multiprocessing
import os
import time
import uuid

DEFAULT_PROCESSES = (1, 2, 4, 8)


def claim_for(seconds: float, tenant_id: int, start_at: float) -> int:
    """In a child process: claim and complete new keys until `seconds` have passed; how many."""
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "idemops.settings")
    django.setup()
    from tools_app import engine

    prefix = uuid.uuid4().hex[:8]
    time.sleep(max(0.0, start_at - time.time()))  # every process starts together
    deadline, done = time.monotonic() + seconds, 0
    while time.monotonic() < deadline:
        engine.run(engine.Operation(tenant_id=tenant_id, tool="bench", key=f"{prefix}-{done}",
                                    arguments={"n": done}, actor="agent:bench/ceiling"),
                   lambda record: {"ok": True})
        done += 1
    return done


def run(quick: bool = False) -> str:
    from tools_app import access

    tenant = access.create_tenant(f"ceiling-{uuid.uuid4().hex[:6]}")
    counts, seconds = ((1, 2), 2.0) if quick else (DEFAULT_PROCESSES, 10.0)
    spawn = multiprocessing.get_context("spawn")
    rows, best = [], (0.0, 0)
    for processes in counts:
        with spawn.Pool(processes) as pool:
            start_at = time.time() + 3  # after every child has set Django up
            done = pool.starmap(claim_for, [(seconds, tenant.pk, start_at)] * processes)
        rate = sum(done) / seconds
        best = max(best, (rate, processes))
        rows.append(f"| {processes} | {sum(done)} | {rate:.0f} | {rate / processes:.0f} |")
    return "\n".join([
        "## The ceiling of claims per second on one database", "",
        f"Processes each claiming and completing new keys (`engine.run`, a no-op side effect) for {seconds:g} s, "
        f"all at once{' (quick mode)' if quick else ''}; every claim and completion commits with its audit event.",
        "",
        "| processes | claims | claims/s (total) | claims/s per process |",
        "| --- | --- | --- | --- |",
        *rows, "",
        f"Ceiling measured: **{best[0]:.0f} claims/s** (with {best[1]} processes). The processes and PostgreSQL "
        f"share this machine's {os.cpu_count()} cores, so a database on its own server sets a higher one.",
    ])
