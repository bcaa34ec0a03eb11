"""`make bench`: run every bench/bench_*.py on a dedicated database and write docs/benchmarks.md.

Each module's `run()` returns a markdown section. Figures from one run are
comparable with each other; absolute times depend on the machine's load.
"""

from __future__ import annotations

import importlib
import os
import platform
import re
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
    header = [
        "# Benchmarks", "",
        "Produced by `make bench` (`.venv/bin/python bench/run.py`; `bench/run.py <name>…` runs some "
        "modules again and replaces only their sections; each section ends with when it was measured): "
        f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}. "
        "Embedded PostgreSQL under var/bench-pg, fsync on. Compare the ratios within one run; absolute "
        "times move with the machine's load.", "",
    ]
    # Running some modules replaces their sections and keeps the others' from earlier runs;
    # each section's closing line says when and under what load it was measured.
    sections = _sections((ROOT / "docs" / "benchmarks.md").read_text()) if selected else {}
    for name in modules:
        started, load = time.monotonic(), os.getloadavg()[0]
        print(f"running {name} …", flush=True)
        if on_bench_database():
            fresh_database()  # what one module loads (a million rows, say) must not skew the next
        section = importlib.import_module(f"bench.{name}").run()
        print(section, flush=True)
        sections[name] = (f"{section}\n_{name}: {time.monotonic() - started:.0f}s, "
                          f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, load average before {load:.1f}_\n")
        # Written after each section, so a failing one loses nothing measured before it.
        ordered = [sections[m] for m in sorted(sections)]
        (ROOT / "docs" / "benchmarks.md").write_text("\n".join(header + ordered))
    print("wrote docs/benchmarks.md")


def _sections(text: str) -> dict[str, str]:
    """The sections of an earlier docs/benchmarks.md by module, each ending with its `_bench_x: …_` line."""
    found, start = {}, None
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if start is None and line.startswith("## "):
            start = i
        match = TRAILER.match(line)
        if match and start is not None:
            found[match.group(1)] = "".join(lines[start:i + 1])
            start = None
    return found


TRAILER = re.compile(r"^_(bench_\w+): ")


def fresh_database() -> None:
    from django.core.management import call_command
    from django.db import connections

    connections.close_all()
    fresh_database_url()
    call_command("migrate", verbosity=0, interactive=False)


if __name__ == "__main__":
    main(sys.argv[1:])
