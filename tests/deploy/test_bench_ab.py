"""The A/B scripts (bench/ab_engine.py, bench/ab_tasks.py, bench/ab_mcp.py, bench/ab_drive_mcp.py) run end to end,
so none rots unnoticed.

Each compares this checkout with itself at the smallest size, as `docs/performance.md` runs them with a
checkout of the commit before a change, on its own embedded cluster. Only that they run and print
both sides is asserted: what a change gains is what the scripts report, not what a test decides.
"""

import os
import subprocess
import sys

import pytest

from idemops import embedded_pg
from tests.support.processes import ROOT, VAR_DIR

pytestmark = pytest.mark.live


@pytest.mark.parametrize("script, size, sides", [
    ("ab_engine.py", ["--calls", "20"], ("| 1 | before |", "| 1 | after |")),
    ("ab_tasks.py", ["--tasks", "2"], ("| 1 | before |", "| 1 | after |")),
    ("ab_mcp.py", ["--seconds", "0.5"], ("32 client(s), before:", "32 client(s), after :")),
    ("ab_drive_mcp.py", ["--requests", "5"], ("| 1 | before |", "| 1 | after |")),
])
def test_an_ab_script_compares_two_checkouts_round_by_round(script, size, sides):
    pgdata = VAR_DIR / f"bench-ab-test-{script.removesuffix('.py')}"
    env = {**os.environ, "BENCH_PGDATA": str(pgdata), "DJANGO_SETTINGS_MODULE": "idemops.settings"}
    env.pop("DATABASE_URL", None)
    try:
        finished = subprocess.run([sys.executable, f"bench/{script}", str(ROOT), "--rounds", "1", *size], cwd=ROOT,
                                  env=env, capture_output=True, text=True, timeout=600)
    finally:
        embedded_pg.stop(pgdata)
    assert finished.returncode == 0, finished.stderr[-3000:]
    for side in sides:  # each side measured, with a figure
        assert any(side in line and any(c.isdigit() for c in line.split(side)[1]) for line in
                   finished.stdout.splitlines()), (side, finished.stdout)
