"""`make bench`: run every bench/bench_*.py on a dedicated database and write docs/benchmarks.md.

Each module's `run()` returns a markdown section. Figures from one run are
comparable with each other; absolute times depend on the machine's load.
"""

from __future__ import annotations

import importlib
import os
import platform
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import fresh_database_url, on_bench_database, setup_django  # noqa: E402


def main(selected: list[str]) -> None:
    setup_django()
    modules = sorted(p.stem for p in (ROOT / "bench").glob("bench_*.py"))
    if selected:
        modules = [m for m in modules if any(s in m for s in selected)]
    load = os.getloadavg()
    header = [
        "# Benchmarks", "",
        f"Produced by `make bench` (`{' '.join(['.venv/bin/python bench/run.py', *selected])}`) on "
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC: {platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, load average before {load[0]:.1f}. "
        "Embedded PostgreSQL under var/bench-pg, fsync on. Compare the ratios within one run; absolute "
        "times move with the machine's load.", "",
    ]
    sections = []
    for name in modules:
        started = time.monotonic()
        print(f"running {name} …", flush=True)
        if on_bench_database():
            fresh_database()  # what one module loads (a million rows, say) must not skew the next
        section = importlib.import_module(f"bench.{name}").run()
        print(section, flush=True)
        sections.append(f"{section}\n_{name}: {time.monotonic() - started:.0f}s_\n")
        # Written after each section, so a failing one loses nothing measured before it.
        (ROOT / "docs" / "benchmarks.md").write_text("\n".join(header + sections))
    print("wrote docs/benchmarks.md")


def fresh_database() -> None:
    from django.core.management import call_command
    from django.db import connections

    connections.close_all()
    fresh_database_url()
    call_command("migrate", verbosity=0, interactive=False)


if __name__ == "__main__":
    main(sys.argv[1:])
