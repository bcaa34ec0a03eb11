"""bench/bench_observability.py in its quick mode, so the benchmark cannot rot (figures: docs/benchmarks.md)."""


def test_the_observability_benchmark_runs_in_quick_mode_and_times_every_piece(transactional_db):
    from bench import bench_observability

    section = bench_observability.run(quick=True)

    rows = [line for line in section.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert len(rows) == 4
    assert all(float(row.strip("|").split("|")[-1]) > 0 for row in rows)
    assert "60 rows" in section  # 20 tools × 3 outcomes, written in one statement
