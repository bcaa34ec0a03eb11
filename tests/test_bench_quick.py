"""The benchmarks added with issues 12 and 13, in their quick modes, so none can rot (their
figures live in docs/benchmarks.md; observability and settle have their own modules)."""

import pytest
from django.db import connection

pytestmark = pytest.mark.live


def rows_of(section: str) -> list[list[str]]:
    rows = [line for line in section.splitlines() if line.startswith("| ") and "---" not in line][1:]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows]


def test_the_search_benchmark_embeds_a_document_and_times_every_mode(transactional_db):
    from bench import bench_search

    section = bench_search.run(quick=True)

    assert "chunks/s" in section
    assert [row[0] for row in rows_of(section)] == ["keyword", "semantic", "hybrid"]


def test_the_task_push_benchmark_times_a_transition_and_a_push_to_a_listening_client(transactional_db):
    from bench import bench_task_push

    section = bench_task_push.run(quick=True)

    figures = {row[0]: row[1] for row in rows_of(section)}
    assert float(figures["with notify"].replace(",", "")) > 0 and float(figures["median"]) > 0


def test_the_claims_ceiling_benchmark_claims_in_child_processes_on_the_test_database(transactional_db, monkeypatch):
    from bench import bench_claims_ceiling

    db = connection.settings_dict
    monkeypatch.setenv("DATABASE_URL", f"postgresql://{db['USER']}:{db['PASSWORD']}@/{db['NAME']}?host={db['HOST']}"
                                       + (f"&port={db['PORT']}" if db["PORT"] else ""))

    section = bench_claims_ceiling.run(quick=True)

    rows = rows_of(section)
    assert [row[0] for row in rows] == ["1", "2"]
    assert all(int(row[1]) > 0 for row in rows)
