"""Bare django-q2 jobs the task benchmarks (P6) set beside idemops' tasks, on the same cluster.

`checkpointed`: the floor of a checkpointed task as a bare job: one row for the task, then one write per
step, each committed before the next step starts (what makes a step's output durable), on a minimal table.
No lease, no audit, no history, no outputs: what any durable step runner must at least do.
"""

from __future__ import annotations

TABLE = "bench_checkpointed_floor"


def create_table() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(f"CREATE TABLE IF NOT EXISTS {TABLE} (id bigserial PRIMARY KEY, step integer NOT NULL)")


def checkpointed(steps: int) -> int:
    """The job: a row, then `steps` single-row UPDATEs, each in its own transaction (Django's autocommit)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(f"INSERT INTO {TABLE} (step) VALUES (0) RETURNING id")
        row_id = cursor.fetchone()[0]
        for step in range(1, steps + 1):
            cursor.execute(f"UPDATE {TABLE} SET step = %s WHERE id = %s", [step, row_id])
    return row_id
