"""Every filter and search the console's big lists offer is served by an index, with the tenant scoping: the
plan PostgreSQL makes for the page's own queries (captured from the page, as a person scoped to one tenant
loads it) reads the filtered column in an index condition. Sequential scans are priced out
(`enable_seqscan = off`) so that the planner shows which index it would use on a big table; without a fitting
index the column shows up in a `Filter:` line instead, and the test fails."""

import copy
import itertools
import json
import re
import uuid

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from tests.support.api_support import make_approval_request, make_event, make_outbox_event, make_record, make_task
from tests.support.operators import make_operator
from tools_app.access.roles import AUDITOR
from tools_app.models import ApprovalRequest, AuditEvent, IdempotencyRecord, OutboxEvent, Task

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
OPERATION = uuid.UUID("0b3e5b2a-1c2d-4e5f-8a9b-0c1d2e3f4a5b")

# list -> (table, [(what, query string, columns the plan must read through an index condition)]). A filter on a
# rare value must be read through its index; the tenant (half of the rows here) and an order are read in the
# list's order through an index, which the planner rightly prefers for a page of 100 rows.
BIG_LISTS = {
    "idempotencyrecord": ("tools_app_idempotencyrecord", [
        ("status", {"status__exact": "failed"}, ["status"]),
        ("error class", {"error_class__exact": "invalid_input"}, ["error_class"]),
        ("tool", {"tool": "create_order"}, ["tool"]),
        ("tenant", {"tenant__id__exact": "{tenant}"}, []),
        ("created from/to", {"created_at__gte": "2026-03-01", "created_at__lte": "2026-03-02"}, ["created_at"]),
        ("finished from/to", {"finished_at__gte": "2026-03-01", "finished_at__lte": "2026-03-02"},
         ["finished_at"]),
        ("search", {"q": str(OPERATION)}, ["operation_id", "trace_id"]),
        ("order by created", {"o": "7"}, []),
    ]),
    "auditevent": ("tools_app_auditevent", [
        ("action", {"action": "record.succeeded"}, ["action"]),
        ("object type", {"object_type": "idempotencyrecord"}, ["object_type"]),
        ("tenant", {"tenant__id__exact": "{tenant}"}, []),
        ("created from/to", {"created_at__gte": "2026-03-01", "created_at__lte": "2026-03-02"}, ["created_at"]),
        ("search", {"q": TRACE}, ["actor", "object_id", "trace_id"]),
        ("search an operation", {"q": str(OPERATION)}, ["operation_id"]),
    ]),
    "task": ("tools_app_task", [
        ("status", {"status__exact": "failed"}, ["status"]),
        ("tool", {"tool": "ingest_document"}, ["tool"]),
        ("failure class", {"failure_class": "internal_error"}, ["failure_class"]),
        ("tenant", {"tenant__id__exact": "{tenant}"}, []),
        ("created from/to", {"created_at__gte": "2026-03-01", "created_at__lte": "2026-03-02"}, ["created_at"]),
        ("finished from/to", {"finished_at__gte": "2026-03-01", "finished_at__lte": "2026-03-02"},
         ["finished_at"]),
        ("search", {"q": TRACE}, ["trace_id"]),
    ]),
    "approvalrequest": ("tools_app_approvalrequest", [
        ("status", {"status__exact": "pending"}, ["status"]),
        ("tool", {"tool": "request_payment"}, ["tool"]),
        ("tenant", {"tenant__id__exact": "{tenant}"}, []),
        ("created from/to", {"created_at__gte": "2026-03-01", "created_at__lte": "2026-03-02"}, ["created_at"]),
        ("finished from/to", {"finished_at__gte": "2026-03-01", "finished_at__lte": "2026-03-02"},
         ["finished_at"]),
        ("search", {"q": "agent:acme/bot"}, ["requested_by", "trace_id"]),
    ]),
    "outboxevent": ("tools_app_outboxevent", [
        ("status", {"status__exact": "pending"}, ["status"]),
        ("kind", {"kind": "notification.email"}, ["kind"]),
        ("tenant", {"tenant__id__exact": "{tenant}"}, []),
        ("created from/to", {"created_at__gte": "2026-03-01", "created_at__lte": "2026-03-02"}, ["created_at"]),
        ("delivered from/to", {"delivered_at__gte": "2026-03-01", "delivered_at__lte": "2026-03-02"},
         ["delivered_at"]),
    ]),
}




MANY = 1_000


def copies(template, n: int, **common) -> list:
    """`n` unsaved copies of `template` with `common` values and fresh unique ones."""
    rows = []
    for _ in range(n):
        row = copy.copy(template)
        row._state = copy.copy(template._state)
        row._state.adding = True
        row.pk = uuid.uuid4() if isinstance(template.pk, uuid.UUID) else None
        for name, value in common.items():
            setattr(row, name, value() if callable(value) else value)
        rows.append(row)
    return rows


@pytest.fixture
def rows(tenant, other_tenant):
    """Each big list with many rows of the person's tenant whose values are common, a few rows whose values
    the filters ask for, and the other tenant's: the statistics of a table in use, for the planner."""
    for owner in (tenant, other_tenant):
        for _ in range(3):
            make_record(owner, status="failed", error_class="invalid_input")
            make_event(owner)
            make_task(owner)
            make_approval_request(owner)
            make_outbox_event(owner)
    halves = itertools.cycle([tenant, other_tenant])
    fresh_records = {"key": lambda: uuid.uuid4().hex, "operation_id": uuid.uuid4, "tenant": lambda: next(halves)}
    record = make_record(tenant, tool="other_tool")
    IdempotencyRecord.objects.bulk_create(copies(record, MANY, **fresh_records))
    AuditEvent.objects.bulk_create(copies(make_event(tenant), MANY, action="task.created", object_type="task",
                                            tenant=lambda: next(halves)))
    task = make_task(tenant)
    records = IdempotencyRecord.objects.bulk_create(copies(record, 2 * MANY, **fresh_records))
    Task.objects.bulk_create(copies(task, MANY, tool="other_task", status="cancelled", tenant=lambda: next(halves),
                                    record=lambda: records.pop()))
    approval = make_approval_request(tenant)
    ApprovalRequest.objects.bulk_create(copies(approval, MANY, tool="other_payment", status="expired",
                                               tenant=lambda: next(halves),
                                               record=lambda: records.pop()))
    OutboxEvent.objects.bulk_create(copies(make_outbox_event(tenant), MANY, kind="webhook",
                                                    status="delivered", tenant=lambda: next(halves)))
    with connection.cursor() as cursor:
        for table, _ in BIG_LISTS.values():
            cursor.execute(f"ANALYZE {table}")


def index_conditions(plan: dict, indexes: dict[str, str]) -> list[str]:
    """Every condition the plan reads through one of `indexes` (name: definition), in any node at any depth:
    its index condition, and the predicate of a partial index (`outbox_due` is the pending events)."""
    found = []
    if plan.get("Index Name") in indexes:
        found += [plan.get("Index Cond", ""), indexes[plan["Index Name"]].partition(" WHERE ")[2]]
    for child in plan.get("Plans", []):
        found += index_conditions(child, indexes)
    return [condition for condition in found if condition]


def page_queries(captured: CaptureQueriesContext, table: str) -> list[str]:
    """The page's queries of the list's rows: the rows shown and their bounded count (not the sidebar's)."""
    return [query["sql"] for query in captured.captured_queries
            if f'FROM "{table}"' in query["sql"] and "LIMIT" in query["sql"] and "LIMIT 10000" not in query["sql"]]


@pytest.mark.parametrize("name", BIG_LISTS)
def test_each_filter_of_each_big_list_is_read_through_an_index(client, tenant, rows, name):
    table, filters = BIG_LISTS[name]
    client.force_login(make_operator("ada", AUDITOR, tenant))
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = %s", [table])
        indexes = dict(cursor.fetchall())
        # A partitioned table (audit events: tools_app/core/audit_partitions.py) is read through its
        # partitions' indexes, each attached to one of the table's: name them by what they are part of.
        cursor.execute("SELECT child.relname, parent.relname FROM pg_inherits i "
                       "JOIN pg_class child ON child.oid = i.inhrelid JOIN pg_class parent ON parent.oid = i.inhparent "
                       "WHERE parent.relname = ANY(%s)", [list(indexes)])
        indexes |= {child: indexes[parent] for child, parent in cursor.fetchall()}
    unserved = []
    for what, params, columns in filters:
        params = {key: value.format(tenant=tenant.pk) for key, value in params.items()}
        with CaptureQueriesContext(connection) as captured:
            page = client.get(reverse(f"admin:tools_app_{name}_changelist"), params)
        assert page.status_code == 200 and "not applied" not in page.text, what
        queries = page_queries(captured, table)
        assert queries, f"{what}: the page read no rows of its table"
        for sql in queries:
            plan = planned(sql)
            conditions = index_conditions(plan, indexes)
            if '"Seq Scan"' in json.dumps(plan) or not conditions and not ordered_by_index(plan, indexes):
                unserved.append(f"{what}: no index read\n{sql}\n{json.dumps(plan, indent=1)}")
            for column in columns:
                if not any(re.search(rf"\b{column}\b", condition) for condition in conditions):
                    unserved.append(f"{what}: {column} read through no index\n{sql}\n{json.dumps(plan, indent=1)}")
    assert not unserved, "\n\n".join(unserved)


def planned(sql: str) -> dict:
    with connection.cursor() as cursor:
        cursor.execute("SET enable_seqscan = off")
        try:
            cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}")
            raw = cursor.fetchone()[0]
        finally:
            cursor.execute("RESET enable_seqscan")
    return (raw if isinstance(raw, list) else json.loads(raw))[0]["Plan"]


def ordered_by_index(plan: dict, indexes: dict[str, str]) -> bool:
    """The table read in the page's order through one of `indexes`, stopping at the page's end."""
    if plan.get("Node Type") in ("Index Scan", "Index Only Scan") and plan.get("Index Name") in indexes:
        return True
    return any(ordered_by_index(child, indexes) for child in plan.get("Plans", []))
