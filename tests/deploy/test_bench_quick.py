"""`make bench-quick`: every benchmark runs end to end at small sizes, so none can rot unnoticed.

It runs as `make bench` does (bench/run.py in its own process, on its own embedded PostgreSQL
cluster), and every figure of the performance issue comes out with a value. Whether a target is
met is not asserted: speed is what `make bench` reports, not what a test decides.
"""

import json
import os
import subprocess
import sys

import pytest

from bench.run import FIGURES
from idemops import embedded_pg
from tests.support.processes import ROOT, VAR_DIR

pytestmark = pytest.mark.live


def test_every_benchmark_runs_in_quick_mode_and_reports_every_figure_by_name(tmp_path):
    pgdata = VAR_DIR / "bench-quick-test-pg"
    env = {**os.environ, "BENCH_PGDATA": str(pgdata), "DJANGO_SETTINGS_MODULE": "idemops.settings"}
    env.pop("DATABASE_URL", None)
    # As `make bench-quick` runs on a developer's machine: without the setting the suite gives its own servers
    # (tests/conftest.py), so a benchmark that calls a tool asking its user first must say so itself.
    env.pop("IDEMOPS_MCP_USER_CONFIRMATION", None)
    try:
        finished = subprocess.run([sys.executable, "bench/run.py", "--quick", "--out", str(tmp_path)], cwd=ROOT,
                                  env=env, capture_output=True, text=True, timeout=1800)
    finally:
        embedded_pg.stop(pgdata)

    assert finished.returncode == 0, finished.stdout[-3000:] + finished.stderr[-3000:]
    report = json.loads((tmp_path / "benchmarks.json").read_text())
    assert sorted(report["figures"]) == sorted(FIGURES)
    for name, figure in report["figures"].items():
        assert figure["value"] is not None and figure["value"] > 0, (name, figure)
        assert isinstance(figure["met"], bool), (name, figure)
    assert all(section["quick"] for section in report["sections"].values())
    markdown = (tmp_path / "benchmarks.md").read_text()
    assert "not measured" not in markdown and "**Failed**" not in markdown
    # P10's split: idemops around the floor's own statement (bench/floor_tool.py) answered its calls too.
    assert "| idemops floor_order | 32 |" in markdown and "P10 split, in the same rounds" in markdown
    # P3's split: the engine's statements alone, sent raw, in the same rounds as the engine and DBOS.
    p3 = report["figures"]["P3"]
    assert p3["detail"]["engine_statements_per_s"] > 0 and p3["detail"]["engine_over_statements"] > 0, p3
    assert "The engine's statements alone / DBOS" in markdown
    # ...and the pieces of Python every first execution needs, each timed alone (bench/engine_pieces.py), with
    # what 4x DBOS leaves the engine beyond its statements (negative where the statements alone exceed it).
    assert p3["detail"]["pieces_in_a_call_us"] > 0 and "allowed_beyond_statements_us" in p3["detail"], p3
    table = markdown.partition("| a piece every first call needs, timed alone |")[2]
    table = table.partition("| **their sum for one first call** |")[0]
    assert len([line for line in table.splitlines()[2:] if line.startswith("| ")]) == 6, table
    # ...and where the engine's time beyond its statements goes: Django's transaction and core.db around the same
    # statements, then the engine's own Python; in time, the calling thread's CPU and its database session's (the
    # embedded server runs on this machine, so the kernel's figures for its process are read).
    for part in ("django_and_db_us", "engine_own_us"):
        assert all(isinstance(p3["detail"][part][what], float) for what in ("time", "cpu", "session_cpu")), p3
    cpu_rows = markdown.partition("| µs a first execution (median of rounds) |")[2].split("\n\n")[0].splitlines()[2:]
    assert [row.split("|")[1].strip() for row in cpu_rows] == [
        "the engine's statements alone, sent raw", "the same statements in Django's transaction, through core.db",
        "the engine", "DBOS (its sessions are a pool, not read)",
        "**Django's transaction and core.db beyond the raw statements**", "**the engine's own Python beyond them**",
    ], cpu_rows
    assert "n/a" not in "".join(cpu_rows[:3] + cpu_rows[4:]), cpu_rows
    # bench_settle reports no figure: its table says that after each of its three faults every key took effect
    # exactly once and every answer carried a class.
    settle = report["sections"]["bench_settle"]["markdown"]
    rows = [line for line in settle.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert len(rows) == 3, settle
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        assert cells[4] == "yes", row  # exactly once
        assert cells[5] == "0", row  # every answer carried a class


def test_each_tool_of_the_mcp_benchmark_is_called_by_its_own_name():
    """The load generator's bodies name the tool measured: a row labelled `floor_order` measures floor_order
    (the load generator checks only that each call succeeded, which another tool's would as well)."""
    from bench.bench_mcp import bodies

    for tool in ("create_order", "floor_order", "whoami", "noop"):
        call = json.loads(bodies(tool)())
        assert call["method"] == "tools/call" and call["params"]["name"] == tool
    assert json.loads(bodies("floor_order")())["params"]["arguments"]["idempotency_key"]


def test_the_in_process_driver_of_mcp_calls_measures_each_call_against_the_bare_sdk(tmp_path):
    """bench/drive_mcp.py (the Python of one /mcp call, no HTTP server) runs, answers every call (the floor's
    too) and writes the profile it is asked for."""
    pgdata = VAR_DIR / "bench-drive-test-pg"
    env = {**os.environ, "BENCH_PGDATA": str(pgdata), "DJANGO_SETTINGS_MODULE": "idemops.settings"}
    env.pop("DATABASE_URL", None)
    profile = tmp_path / "whoami.prof"
    try:
        finished = subprocess.run([sys.executable, "bench/drive_mcp.py", "--rounds", "1", "--requests", "5",
                                   "--profile", str(profile)], cwd=ROOT, env=env, capture_output=True, text=True,
                                  timeout=600)
    finally:
        embedded_pg.stop(pgdata)

    assert finished.returncode == 0, finished.stdout[-3000:] + finished.stderr[-3000:]
    rows = [line for line in finished.stdout.splitlines() if line.startswith("| ") and "×" in line]
    assert [row.split(" | ")[0] for row in rows] == ["| bare SDK, no-op", "| floor, create_order", "| idemops whoami",
                                                      "| idemops create_order"]
    assert "create_order's wall time, the floor's ÷ idemops'" in finished.stdout
    assert profile.stat().st_size > 0


def test_the_pieces_of_a_first_call_are_each_timed_alone_in_a_loop_and_after_a_round_trip():
    """bench/engine_pieces.py (also printed in P3's section) runs on its own: each piece every first call needs
    has both its times, and their sum is given."""
    pgdata = VAR_DIR / "bench-pieces-test-pg"
    env = {**os.environ, "BENCH_PGDATA": str(pgdata), "DJANGO_SETTINGS_MODULE": "idemops.settings"}
    env.pop("DATABASE_URL", None)
    try:
        finished = subprocess.run([sys.executable, "bench/engine_pieces.py", "--number", "20"], cwd=ROOT, env=env,
                                  capture_output=True, text=True, timeout=600)
    finally:
        embedded_pg.stop(pgdata)

    assert finished.returncode == 0, finished.stdout[-3000:] + finished.stderr[-3000:]
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in finished.stdout.splitlines()
            if line.startswith("| ") and "---" not in line][1:]
    assert len(rows) == 7 and rows[-1][0] == "**their sum for one first call**", finished.stdout
    for what, in_a_loop, after_a_round_trip in rows:
        assert float(in_a_loop.strip("*")) >= 0 and float(after_a_round_trip.strip("*")) >= 0, what
    assert float(rows[-1][2].strip("*")) > 0
