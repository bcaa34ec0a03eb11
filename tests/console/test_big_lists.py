"""The evidence lists of the big tables (records, audit events, tasks...) page without a COUNT(*) over
the table: unfiltered, they take the planner's estimate; filtered, they count at most a bound of rows.
The bound is lowered here so that a few rows exceed it."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from tests.api_support import make_record
from tools_app.admin import scoping

BOUND = 5


@pytest.fixture
def bounded(monkeypatch):
    monkeypatch.setattr(scoping, "COUNT_AT_MOST", BOUND)


@pytest.fixture
def records(tenant):
    return [make_record(tenant) for _ in range(BOUND + 3)]


def record_counts(captured: CaptureQueriesContext) -> list[str]:
    """The page's counts of the records list: Django's `.count()` (the sidebar's queue summaries count
    otherwise, `COUNT(id)` of the queues' rows)."""
    return [query["sql"] for query in captured.captured_queries
            if query["sql"].startswith("SELECT COUNT(*)") and '"tools_app_idempotencyrecord"' in query["sql"]]


def test_the_unfiltered_records_list_shows_the_planners_estimate_and_counts_nothing(
        admin_client, bounded, records):
    connection.cursor().execute("ANALYZE tools_app_idempotencyrecord")

    with CaptureQueriesContext(connection) as captured:
        page = admin_client.get("/admin/tools_app/idempotencyrecord/")

    assert page.status_code == 200
    assert record_counts(captured) == []
    assert f"about {len(records)}" in page.text


def test_a_filtered_records_list_counts_at_most_the_bound_and_says_more_than_it(admin_client, bounded, records):
    with CaptureQueriesContext(connection) as captured:
        page = admin_client.get("/admin/tools_app/idempotencyrecord/", {"status__exact": "succeeded"})

    assert page.status_code == 200
    (count,) = record_counts(captured)
    assert f"LIMIT {BOUND + 1}" in count
    assert f"more than {BOUND}" in page.text


def test_a_filtered_list_under_the_bound_shows_its_exact_count(admin_client, bounded, tenant):
    make_record(tenant, status="failed", error_class="invalid_input")
    make_record(tenant)

    page = admin_client.get("/admin/tools_app/idempotencyrecord/", {"status__exact": "failed"})

    assert page.status_code == 200
    assert "1 idempotency record" in page.text and "more than" not in page.text
