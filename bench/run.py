"""`make bench`: run every bench/bench_*.py on a dedicated database; write docs/benchmarks.md and .json.

    .venv/bin/python bench/run.py                  every module, full sizes -> docs/
    .venv/bin/python bench/run.py engine tasks     only those modules; their sections and figures
                                                   replace the earlier ones in docs/ (each section
                                                   keeps its own date)
    .venv/bin/python bench/run.py --quick          every module at small sizes -> var/bench-quick/
                                                   (`make bench-quick`; a test runs it so none rots)

Each module's `run(quick)` returns a `bench.common.Section`: its markdown and the named figures
(P1 … P9 of the performance issue, P10 … P11 of issue 24, P12 … P17 of issue 28, P18 of issue 36) it measured.
docs/benchmarks.json holds every figure by name and every section; docs/benchmarks.md is rendered from it.
Figures from one section were measured side by side in one run; absolute times move with the machine's load.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    BENCH_DATABASE,
    Figure,
    Section,
    fresh_database_url,
    on_bench_database,
    setup_django,
)

DOCS = ROOT / "docs"
QUICK_OUT = ROOT / "var" / "bench-quick"

# The performance issue's figures, in its order: what each compares, and its target.
FIGURES: dict[str, str] = {
    "P1": "engine claim+complete vs raw `INSERT … ON CONFLICT` + `UPDATE` (minimal table)",
    "P2": "engine replay vs raw indexed `SELECT`",
    "P3": "engine first executions/s in process vs DBOS Transact one-step workflows, same PostgreSQL",
    "P4": "`create_order` over `/mcp` vs the bare SDK serving a no-op tool, 1 and 32 clients",
    "P4b": "`whoami` over `/mcp` vs the bare SDK no-op",
    "P5": "follower p99 in a storm of 50 identical calls vs the executor's latency",
    "P6": "checkpointed 7-step task vs a bare django-q2 job, tasks/s",
    "P6b": "per-step checkpoint overhead, in single-row `UPDATE`+commit units",
    "P7": "SIGKILL of a worker → progress resumed, default settings",
    "P8": "replay latency with 1M records vs 1k",
    "P9": "web tier scale: 2 web processes vs 1 (calls/s, 32 clients)",
    "P10": "`create_order` over `/mcp` vs the floor (the bare SDK whose tool claims the key, inserts the order and "
           "stores the result in one transaction), 1 and 32 clients",
    "P11": "`create_order` over `/mcp`: its gain from 1 to 32 clients vs the floor's gain in the same round",
    "P12": "Django's psycopg pool (4 connections) vs persistent connections (one per thread), requests/s of 16 "
           "threads",
    "P13": "SIGKILL of the cluster holding a queued task's job → the task taken by another cluster, default settings",
    "P14": "replay latency with 10M records vs 1k (issue 28's big tables)",
    "P15": "console record list p95 with 10M records, over HTTP",
    "P16": "console find-by-key p95 with 10M records, over HTTP",
    "P17": "console record page p95 with 10M records, over HTTP",
    "P18": "bulk action over 10,000 UNKNOWN records: seconds to finish",
    "P19": "`create_order` over `/mcp`: calls/s with personal values in clear vs encrypted (issue 41), 1 and 8 "
           "clients",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("modules", nargs="*", help="run only the modules whose names contain one of these")
    parser.add_argument("--quick", action="store_true", help="small sizes, written to var/bench-quick/")
    parser.add_argument("--out", type=Path, help="write benchmarks.md and .json here instead")
    args = parser.parse_args()
    out = args.out or (QUICK_OUT if args.quick else DOCS)
    out.mkdir(parents=True, exist_ok=True)
    setup_django()
    if on_bench_database():
        keep_migrated_schema()
    modules = sorted(p.stem for p in (ROOT / "bench").glob("bench_*.py"))
    if args.modules:
        modules = [m for m in modules if any(s in m for s in args.modules)]
    # A partial full-size run updates what it ran and keeps the rest; a quick run starts afresh.
    report = _load(out / "benchmarks.json") if args.modules and not args.quick else {}
    report.setdefault("figures", {})
    report.setdefault("sections", {})
    # The benchmarks' own environment variables (BENCH_…: sizes, the cluster's directory) are part of the command.
    bench_env = [f"{name}={value}" for name, value in sorted(os.environ.items()) if name.startswith("BENCH_")]
    command = " ".join([*bench_env, ".venv/bin/python bench/run.py", *(["--quick"] if args.quick else []),
                        *args.modules])
    failures = []
    for name in modules:
        started = time.monotonic()
        load_before = os.getloadavg()[0]
        print(f"running {name}{' (quick)' if args.quick else ''} …", flush=True)
        if on_bench_database():
            fresh_database()  # what one module loads (a million rows, say) must not skew the next
        try:
            section = importlib.import_module(f"bench.{name}").run(quick=args.quick)
        except Exception as exc:  # the others still run, and the failure is on record
            failures.append(name)
            section = Section(f"## {name}\n\n**Failed**: `{type(exc).__name__}: {exc}`\n")
            import traceback

            traceback.print_exc()
        if isinstance(section, str):
            section = Section(section)
        print(section.markdown, flush=True)
        for figure in section.figures:
            report["figures"][figure.name] = {**figure.__dict__, "section": name}
        report["sections"][name] = {
            "markdown": section.markdown, "seconds": round(time.monotonic() - started),
            "at": f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC", "command": command, "quick": args.quick,
            "load_before": round(load_before, 1), "load_after": round(os.getloadavg()[0], 1),
            "figures": [figure.name for figure in section.figures],
        }
        report["machine"] = {"machine": platform.machine(), "cores": os.cpu_count(),
                             "python": platform.python_version()}
        # Written after each section, so a failing one loses nothing measured before it.
        (out / "benchmarks.json").write_text(json.dumps(report, indent=2, ensure_ascii=False, default=str) + "\n")
        (out / "benchmarks.md").write_text(render(report))
    print(f"wrote {out / 'benchmarks.md'} and {out / 'benchmarks.json'}")
    if failures:
        sys.exit(f"failed: {', '.join(failures)}")


def _load(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def render(report: dict) -> str:
    machine = report.get("machine", {})
    lines = [
        "# Benchmarks", "",
        "Produced by `make bench` (`.venv/bin/python bench/run.py`; `make bench-quick` runs the same code at small "
        f"sizes). Machine: {machine.get('machine')}, {machine.get('cores')} cores, Python {machine.get('python')}; "
        "embedded PostgreSQL under var/bench-pg, fsync on. Every figure but P7, P13 and P18 (seconds) and P15–P17 "
        "(milliseconds, against an absolute bound) is a ratio measured side by side in one run (the two sides "
        "interleaved in rounds); the spread is the lowest and highest round. "
        "Absolute times move with the machine's load, which each section states. docs/benchmarks.json holds the "
        "same figures by name; docs/performance.md says how they are measured and what stands between a figure "
        "and its target.", "",
        "## The figures", "",
        "| | what | figure | spread | target | met |", "| --- | --- | ---: | ---: | ---: | --- |",
    ]
    for name, what in FIGURES.items():
        figure = report["figures"].get(name)
        if figure is None:
            lines.append(f"| {name} | {what} | not measured | | | |")
            continue
        shown = Figure(**{k: v for k, v in figure.items() if k != "section"})
        if shown.spread is not None:
            shown.spread = tuple(shown.spread)
        met = "—" if shown.met is None else ("yes" if shown.met else "**no**")
        lines.append(f"| {name} | {what} | {shown.cell()} | {shown.spread_cell()} | {shown.target} | {met} |")
    lines.append("")
    for name, section in sorted(report["sections"].items()):
        lines += [section["markdown"].rstrip(), "",
                  f"_{name}: {section['seconds']} s, {section['at']}, `{section['command']}`, load average "
                  f"{section['load_before']} before, {section['load_after']} after._", ""]
    return "\n".join(lines)


# The schema as this run's migrations left it (setup_django migrated the bench database), kept as a template: a
# section's fresh database is a copy of it, where migrating each anew took 12 s a section (99 migrations).
SCHEMA_TEMPLATE = f"{BENCH_DATABASE}_migrated"


def keep_migrated_schema() -> None:
    from django.db import connections

    connections.close_all()  # a template must have no connections while it is copied
    fresh_database_url(SCHEMA_TEMPLATE, template=BENCH_DATABASE)


def fresh_database() -> None:
    from django.core.management import call_command
    from django.db import connections

    connections.close_all()
    fresh_database_url(template=SCHEMA_TEMPLATE)
    # Nothing left to apply: it checks that, and runs the post_migrate handlers (roles, schedules) as after a full
    # migrate of an empty database.
    call_command("migrate", verbosity=0, interactive=False)


if __name__ == "__main__":
    main()
