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

from bench.common import setup_django  # noqa: E402


def main(selected: list[str]) -> None:
    setup_django()
    modules = sorted(p.stem for p in (ROOT / "bench").glob("bench_*.py"))
    if selected:
        modules = [m for m in modules if any(s in m for s in selected)]
    sections = []
    for name in modules:
        started = time.monotonic()
        print(f"running {name} …", flush=True)
        section = importlib.import_module(f"bench.{name}").run()
        print(section, flush=True)
        sections.append(f"{section}\n_{name}: {time.monotonic() - started:.0f}s_\n")
    load = os.getloadavg()
    header = [
        "# Benchmarks", "",
        f"Produced by `make bench` (`{' '.join(['.venv/bin/python bench/run.py', *selected])}`) on "
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC: {platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, load average before {load[0]:.1f}. "
        "Embedded PostgreSQL under var/bench-pg, fsync on. Compare the ratios within one run; absolute "
        "times move with the machine's load.", "",
    ]
    (ROOT / "docs" / "benchmarks.md").write_text("\n".join(header + sections))
    print("wrote docs/benchmarks.md")


if __name__ == "__main__":
    main(sys.argv[1:])
