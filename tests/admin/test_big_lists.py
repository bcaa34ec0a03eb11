"""The evidence lists of the big tables (records, audit events, tasks...) page without a COUNT(*) over
the table: unfiltered, they take the planner's estimate; filtered, they count at most a bound of rows.
The bound is lowered here so that a few rows exceed it."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from tests.support.api_support import make_event, make_record
from tools_app.admin import scoping
from tools_app.models import AuditEvent

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


def test_the_unfiltered_audit_list_estimates_from_its_month_partitions_as_autovacuum_analyses_them(
        admin_client, bounded, tenant):
    for i in range(BOUND + 3):
        make_event(tenant, object_id=str(i))
    # Autovacuum analyses each partition, never the partitioned table: the table's own estimate stays stale.
    with connection.cursor() as cursor:
        cursor.execute("SELECT relid::regclass::text FROM pg_partition_tree('tools_app_auditevent') WHERE isleaf")
        for (partition,) in cursor.fetchall():
            cursor.execute(f"ANALYZE {partition}")

    with CaptureQueriesContext(connection) as captured:
        page = admin_client.get("/admin/tools_app/auditevent/")

    assert page.status_code == 200
    assert not [q["sql"] for q in captured.captured_queries
                if q["sql"].startswith("SELECT COUNT(*)") and '"tools_app_auditevent"' in q["sql"]]
    assert f"about {AuditEvent.objects.count()}" in page.text


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
