"""The console's record list reads a page with a fixed number of queries, whatever the page's rows: no query
per row (an N+1, e.g. a column reading a related row or a deferred field), no column of big JSON it does not
show, and, for a person who sees one tenant, the newest rows in the order of the (tenant, created_at) index,
so that PostgreSQL reads one page of it and stops (P15 in docs/performance.md)."""

import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from tests.support.api_support import make_record
from tests.support.operators import make_operator
from tools_app.access.roles import OPERATOR
from tools_app.models import IdempotencyRecord


def replace(record: IdempotencyRecord, **fields) -> IdempotencyRecord:
    """An unsaved copy of `record` with `fields` changed."""
    copy = IdempotencyRecord(**{f.attname: getattr(record, f.attname) for f in record._meta.concrete_fields})
    copy.pk = None
    for name, value in fields.items():
        setattr(copy, name, value)
    return copy


LIST = "/admin/tools_app/idempotencyrecord/"


def rows_query(captured: CaptureQueriesContext) -> str:
    """The page's query of the rows it shows (not its bounded count, the filters' choices or the sidebar)."""
    (sql,) = [query["sql"] for query in captured.captured_queries
              if query["sql"].startswith('SELECT "tools_app_idempotencyrecord"."id"') and " ORDER BY " in query["sql"]]
    return sql


def page_queries(client, **params) -> CaptureQueriesContext:
    with CaptureQueriesContext(connection) as captured:
        page = client.get(LIST, params)
    assert page.status_code == 200
    return captured


@pytest.fixture
def operator(client, tenant):
    person = make_operator("olga", OPERATOR, tenant)
    client.force_login(person)
    return person


def test_the_record_list_reads_a_full_page_with_as_many_queries_as_a_page_of_two_rows(client, tenant, operator):
    for _ in range(2):
        make_record(tenant, status="failed", error_class="invalid_input")
    for _ in range(40):
        make_record(tenant)
    page_queries(client)  # what a first page caches for the process (content types, ...) is not the page's

    two = page_queries(client, status__exact="failed")
    forty_two = page_queries(client)

    assert f"{len(forty_two)} queries" == f"{len(two)} queries", "\n".join(
        query["sql"][:200] for query in forty_two.captured_queries)


def test_the_record_list_does_not_read_the_records_arguments_result_or_evidence(client, tenant, operator):
    make_record(tenant, arguments={"document": "x" * 10_000})

    sql = rows_query(page_queries(client))

    for column in ("arguments", "result", "evidence", "field_digests"):
        assert f'"tools_app_idempotencyrecord"."{column}"' not in sql


def test_a_one_tenant_list_is_ordered_newest_first_as_its_tenant_and_creation_time_index_reads_it(
        client, tenant, operator):
    # given: this tenant's 3,000 records, and the table's statistics saying so (whatever other tests left behind)
    newest = make_record(tenant)
    IdempotencyRecord.objects.bulk_create([
        replace(newest, key=f"older-{n}", operation_id=uuid.uuid4(),
                created_at=newest.created_at - timedelta(seconds=n)) for n in range(1, 3_000)])

    sql = rows_query(page_queries(client))

    assert 'ORDER BY "tools_app_idempotencyrecord"."created_at" DESC' in sql
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE tools_app_idempotencyrecord")
        cursor.execute("SET enable_seqscan = off")  # the plan of a big table, where a page is a small part
        try:
            cursor.execute(f"EXPLAIN {sql}")
            plan = "\n".join(row[0] for row in cursor.fetchall())
        finally:
            cursor.execute("RESET enable_seqscan")
    assert "Index Scan Backward using record_tenant_created" in plan, plan
