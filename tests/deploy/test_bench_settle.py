"""bench/bench_settle.py in its quick mode, so the benchmark cannot rot (its figures live in docs/benchmarks.md)."""

import pytest

pytestmark = pytest.mark.live


def test_the_settle_benchmark_runs_in_quick_mode_and_every_key_took_effect_once(monkeypatch):
    from bench import bench_settle

    # As `make bench` runs it: not with the suite's servers' setting (tests/conftest.py) that no tool asks
    # its user first; its stack's processes inherit this environment.
    monkeypatch.delenv("IDEMOPS_MCP_USER_CONFIRMATION")

    section = bench_settle.run(quick=True)

    rows = [line for line in section.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert len(rows) == 3
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        assert cells[4] == "yes", row  # exactly once
        assert cells[5] == "0", row  # every answer carried a class
