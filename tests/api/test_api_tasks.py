"""Tasks and checkpoints in the auditors' API: nested in JSON, flat in CSV, no content."""

import json

import pytest

from tests.support.api_support import csv_lines, key_client, make_checkpoint

pytestmark = pytest.mark.django_db


def test_a_task_lists_its_checkpoints_and_no_content(tenant):
    checkpoint = make_checkpoint(tenant)

    task = key_client(tenant).get(f"/api/v1/tasks/{checkpoint.task_id}").json()

    assert task["status"] == "succeeded" and task["steps_total"] == 6
    assert [(c["step"], c["checksum"]) for c in task["checkpoints"]] == [("extract_text", "c" * 64)]
    assert "Jane Roe" not in json.dumps(task)


def test_a_tasks_checkpoints_by_task_id(tenant):
    mine, other = make_checkpoint(tenant), make_checkpoint(tenant)

    rows = key_client(tenant).get("/api/v1/checkpoints", {"task": str(mine.task_id)}).json()["results"]

    assert [row["id"] for row in rows] == [mine.pk] and rows[0]["tenant"] == "acme"
    assert other.pk not in [row["id"] for row in rows]


def test_the_task_csv_is_flat_with_a_stable_header(tenant):
    make_checkpoint(tenant)

    header, *rows = csv_lines(key_client(tenant).get("/api/v1/tasks/export.csv"))

    assert header[:4] == ["id", "tenant", "tool", "record"] and "checkpoints" not in header
    assert len(rows) == 1 and "Jane Roe" not in ",".join(rows[0])
