"""Filters and cursor pages return exactly the expected rows, in the expected order."""

import pytest
from django.utils import timezone

from tests.support.api_support import all_pages, at, ids, key_client, make_event, make_record
from tools_app.core import keys
from tools_app.models import RecordStatus

pytestmark = pytest.mark.django_db

RECORDS = "/api/v1/idempotency-records"
EVENTS = "/api/v1/audit-events"


@pytest.fixture
def records(tenant, other_tenant):
    """acme's records, one per line, with every attribute the filters look at."""
    r = {
        "order_ok": make_record(tenant, tool="create_order", created_at=at(0), actor="agent:acme/a"),
        "order_failed": make_record(tenant, tool="create_order", status=RecordStatus.FAILED, error_class="conflict",
                                    created_at=at(10), finished_at=at(11), actor="agent:acme/b"),
        "ticket_transient": make_record(tenant, tool="create_ticket", status=RecordStatus.FAILED,
                                        error_class="transient", created_at=at(20), finished_at=at(50),
                                        actor="agent:acme/a"),
        "ticket_unknown": make_record(tenant, tool="create_ticket", status=RecordStatus.UNKNOWN, created_at=at(30),
                                      actor="agent:acme/b"),
        "order_processing": make_record(tenant, tool="create_order", status=RecordStatus.PROCESSING,
                                        created_at=at(40), actor="agent:acme/a", key="order-2026-0042"),
    }
    make_record(other_tenant, tool="create_order", created_at=at(5), actor="agent:acme/a")  # never visible
    return {name: record.pk for name, record in r.items()}


def listed(client, url, params):
    response = client.get(url, {**params, "page_size": 1000})
    assert response.status_code == 200, response.content
    return set(ids(response))


@pytest.mark.parametrize(("params", "expected"), [
    ({}, {"order_ok", "order_failed", "ticket_transient", "ticket_unknown", "order_processing"}),
    ({"tool": "create_ticket"}, {"ticket_transient", "ticket_unknown"}),
    ({"status": "failed"}, {"order_failed", "ticket_transient"}),
    ({"status": ["unknown", "processing"]}, {"ticket_unknown", "order_processing"}),
    ({"error_class": "transient"}, {"ticket_transient"}),
    ({"error_class": ["transient", "conflict"]}, {"ticket_transient", "order_failed"}),
    ({"actor": "agent:acme/b"}, {"order_failed", "ticket_unknown"}),
    ({"tenant": "acme", "tool": "create_order", "status": "succeeded"}, {"order_ok"}),
    ({"created_after": at(10).isoformat()}, {"order_failed", "ticket_transient", "ticket_unknown",
                                             "order_processing"}),
    ({"created_before": at(10).isoformat()}, {"order_ok"}),
    ({"created_after": at(10).isoformat(), "created_before": at(30).isoformat()},
     {"order_failed", "ticket_transient"}),
    ({"finished_after": at(11).isoformat()}, {"order_failed", "ticket_transient"}),
    ({"finished_before": at(11).isoformat()}, {"order_ok"}),
    ({"key_digest": keys.key_digest("order-2026-0042")}, {"order_processing"}),
    ({"key_digest": keys.key_digest("no-such-key")}, set()),
])
def test_record_filters_return_exactly_the_matching_rows(params, expected, tenant, records):
    client = key_client(tenant)

    assert listed(client, RECORDS, params) == {records[name] for name in expected}


def test_the_operation_id_filter_finds_one_record(tenant, records):
    client = key_client(tenant)
    from tools_app.models import IdempotencyRecord

    operation_id = IdempotencyRecord.objects.get(pk=records["ticket_unknown"]).operation_id

    assert listed(client, RECORDS, {"operation_id": str(operation_id)}) == {records["ticket_unknown"]}


@pytest.mark.parametrize("params", [
    {"status": "DONE"}, {"error_class": "oops"}, {"created_after": "yesterday"}, {"key_digest": "ORDER-1"},
    {"operation_id": "not-a-uuid"}, {"tool": "a\x00b"},
])
def test_an_invalid_filter_is_a_400_naming_the_parameter(params, tenant, records):
    response = key_client(tenant).get(RECORDS, params)

    assert response.status_code == 400
    assert list(response.json()) == list(params)


def test_audit_event_filters_return_exactly_the_matching_rows(tenant, other_tenant):
    e1 = make_event(tenant, action="record.claimed", actor="agent:acme/a", created_at=at(0), object_id="7")
    e2 = make_event(tenant, action="record.succeeded", actor="agent:acme/a", created_at=at(1), object_id="7")
    e3 = make_event(tenant, action="record.claimed", actor="user:alice", created_at=at(2), object_id="8")
    make_event(other_tenant, action="record.claimed", actor="agent:acme/a", created_at=at(1), object_id="7")
    client = key_client(tenant)

    assert listed(client, EVENTS, {"action": "record.claimed"}) == {e1.pk, e3.pk}
    assert listed(client, EVENTS, {"actor": "agent:acme/a"}) == {e1.pk, e2.pk}
    assert listed(client, EVENTS, {"object_type": "idempotencyrecord", "object_id": "7"}) == {e1.pk, e2.pk}
    assert listed(client, EVENTS, {"created_after": at(1).isoformat(), "created_before": at(2).isoformat()}) == {
        e2.pk}


def test_cursor_pages_walk_every_row_once_newest_first(tenant):
    made = [make_record(tenant, created_at=at(i)).pk for i in range(25)]
    client = key_client(tenant)

    served = all_pages(client, RECORDS, {"page_size": 7})

    assert served == list(reversed(made))


def test_cursor_pages_walk_every_row_once_oldest_first(tenant):
    made = [make_record(tenant, created_at=at(i)).pk for i in range(25)]
    client = key_client(tenant)

    served = all_pages(client, RECORDS, {"page_size": 10, "ordering": "created_at"})

    assert served == made


def test_rows_sharing_a_timestamp_are_neither_skipped_nor_repeated(tenant):
    same_time = timezone.now()
    made = [make_record(tenant, created_at=same_time).pk for _ in range(12)]
    made += [make_record(tenant, created_at=at(-1)).pk for _ in range(5)]
    client = key_client(tenant)

    served = all_pages(client, RECORDS, {"page_size": 5, "ordering": "created_at"})

    assert sorted(served) == sorted(made) and len(served) == len(set(served))
    assert served == sorted(made[12:]) + sorted(made[:12])


def test_filters_hold_on_every_page(tenant):
    failed = [make_record(tenant, status=RecordStatus.FAILED, error_class="transient", created_at=at(i)).pk
              for i in range(0, 30, 2)]
    for i in range(1, 30, 2):
        make_record(tenant, created_at=at(i))
    client = key_client(tenant)

    served = all_pages(client, RECORDS, {"page_size": 4, "status": "failed", "ordering": "created_at"})

    assert served == failed


def test_previous_links_walk_back_to_the_first_page(tenant):
    made = [make_record(tenant, created_at=at(i)).pk for i in range(9)]
    client = key_client(tenant)
    first = client.get(RECORDS, {"page_size": 3, "ordering": "created_at"}).json()
    second = client.get(first["next"]).json()

    back = client.get(second["previous"]).json()

    assert [r["id"] for r in back["results"]] == made[:3] and back["previous"] is None


def test_a_time_with_an_offset_postgresql_refuses_is_converted_to_utc(tenant, records):
    # 3500-02-20T01:34+18:36 is valid ISO 8601 but beyond PostgreSQL's ±15:59 offsets (found by schemathesis)
    client = key_client(tenant)

    assert listed(client, RECORDS, {"created_after": "3500-02-20T01:34:32.4+18:36"}) == set()
    assert listed(client, RECORDS, {"created_before": "3500-02-20T01:34:32.4+18:36"}) == set(records.values())
    response = client.get("/api/v1/audit-events/export.csv", {"created_after": "3500-02-20T01:34:32.4+18:36"})
    assert response.status_code == 200


def test_a_time_that_leaves_the_calendar_in_utc_is_a_400(tenant):
    response = key_client(tenant).get(RECORDS, {"created_after": "0001-01-01T00:00:00+01:00"})

    assert response.status_code == 400 and "created_after" in response.json()


@pytest.mark.parametrize("bad_id", ["0.5", "abc", "99999999999999999999999"])
def test_a_malformed_id_is_a_json_404(bad_id, tenant):
    response = key_client(tenant).get(f"{RECORDS}/{bad_id}")

    assert response.status_code == 404 and response["Content-Type"] == "application/json"


def test_a_tampered_cursor_is_a_404(tenant):
    response = key_client(tenant).get(RECORDS, {"cursor": "not-a-cursor"})

    assert response.status_code == 404
