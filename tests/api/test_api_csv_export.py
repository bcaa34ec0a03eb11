"""CSV exports: the filtered list, streamed, with a fixed header and no secrets."""

import csv
import io
import json

import httpx2
import pytest

from tests.support.api_support import at, csv_lines, csv_rows, key_client, make_event, make_record
from tools_app import access
from tools_app.api.idempotency_records import IdempotencyRecordSerializer
from tools_app.core import keys
from tools_app.models import AuditEvent, IdempotencyRecord, RecordStatus
from tools_app.toolkit.calls import Caller, call_tool
from tools_app.toolkit.registry import get_tool

RECORD_COLUMNS = [
    "id", "operation_id", "tenant", "tool", "key_digest", "fingerprint", "argument_names", "status", "error_class",
    "error_message", "attributes", "attempts", "actor", "trace_id", "created_at", "updated_at", "finished_at",
    "retry_not_before", "expires_at", "retired_at",
]
EVENT_COLUMNS = ["id", "seq", "created_at", "tenant", "actor", "action", "object_type", "object_id", "operation_id",
                 "before", "after", "reason", "trace_id", "prev_hash", "hash"]


@pytest.mark.django_db
def test_the_header_row_names_the_columns_in_a_fixed_order(tenant):
    client = key_client(tenant)

    records = csv_lines(client.get("/api/v1/idempotency-records/export.csv"))
    events = csv_lines(client.get("/api/v1/audit-events/export.csv"))

    assert records[0] == RECORD_COLUMNS == list(IdempotencyRecordSerializer().fields)
    assert events[0] == EVENT_COLUMNS


@pytest.mark.django_db
def test_it_streams_the_filtered_rows_in_the_requested_order(tenant):
    failed = [make_record(tenant, status=RecordStatus.FAILED, error_class="transient", created_at=at(i)).pk
              for i in range(0, 10, 2)]
    for i in range(1, 10, 2):
        make_record(tenant, created_at=at(i))
    client = key_client(tenant)

    response = client.get("/api/v1/idempotency-records/export.csv", {"status": "failed", "ordering": "created_at"})

    assert response.status_code == 200 and response.streaming
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    assert response["Content-Disposition"] == 'attachment; filename="idempotency-records.csv"'
    rows = csv_rows(response)
    assert [int(row["id"]) for row in rows] == failed
    assert {(row["status"], row["error_class"], row["tenant"]) for row in rows} == {("failed", "transient", "acme")}


@pytest.mark.django_db
def test_it_answers_to_accept_text_csv(tenant):
    make_record(tenant)
    client = key_client(tenant)

    response = client.get("/api/v1/idempotency-records/export.csv", HTTP_ACCEPT="text/csv")

    assert response.status_code == 200 and len(csv_rows(response)) == 1


@pytest.mark.django_db
def test_an_invalid_filter_is_refused_before_any_row_is_sent(tenant):
    response = key_client(tenant).get("/api/v1/idempotency-records/export.csv", {"status": "DONE"})

    assert response.status_code == 400 and not response.streaming
    assert "status" in response.json()


@pytest.mark.django_db
def test_lists_and_objects_are_flattened_and_formulas_defused(tenant):
    make_record(tenant, arguments={"items": [], "currency": "EUR"}, actor="=HYPERLINK(\"http://x\")")
    make_event(tenant, reason="@SUM(A1)", actor="user:ops")  # a person's reason is exported
    client = key_client(tenant)

    record = csv_rows(client.get("/api/v1/idempotency-records/export.csv"))[0]
    event = [e for e in csv_rows(client.get("/api/v1/audit-events/export.csv")) if e["action"] == "record.succeeded"]

    assert record["argument_names"] == "currency;items"
    assert record["actor"] == "'=HYPERLINK(\"http://x\")"
    assert record["finished_at"] and record["retired_at"] == ""
    assert event[0]["reason"] == "'@SUM(A1)"
    assert json.loads(event[0]["after"]) == {"status": "succeeded"}


@pytest.mark.django_db
def test_an_export_is_itself_recorded_in_the_audit_log(tenant):
    client = key_client(tenant, name="firm")

    csv_rows(client.get("/api/v1/idempotency-records/export.csv", {"tool": "create_order"}))

    event = AuditEvent.objects.get(action="api.exported")
    assert event.actor == "auditor:firm" and event.tenant_id is None
    assert event.after == {"resource": "idempotency-records", "filters": {"tool": "create_order"}}


@pytest.mark.django_db
def test_neither_json_nor_csv_carries_the_key_the_arguments_or_the_result(tenant):
    # given a real operation through the engine, with a key and personal data in its arguments
    caller = Caller(tenant_id=tenant.pk, actor="agent:acme/bot")
    arguments = {"customer": "Jane Roe, 12 Secret Lane", "currency": "EUR",
                 "items": [{"sku": "BOLT-1", "quantity": 3, "unit_price": "2.50"}],
                 "idempotency_key": "jane-roe-order-77"}
    result = call_tool(get_tool("create_order"), caller, arguments)
    assert result.error is None
    record = IdempotencyRecord.objects.get(key="jane-roe-order-77")
    client = key_client(tenant)

    # when it is read as JSON and exported as CSV
    as_json = client.get(f"/api/v1/idempotency-records/{record.pk}").content.decode()
    as_csv = b"".join(client.get("/api/v1/idempotency-records/export.csv").streaming_content).decode()
    events_csv = b"".join(client.get("/api/v1/audit-events/export.csv").streaming_content).decode()

    # then only the digest, the fingerprint and the argument names appear
    for exported in (as_json, as_csv, events_csv):
        assert "jane-roe-order-77" not in exported
        assert "Jane Roe" not in exported and "Secret Lane" not in exported
        assert "BOLT-1" not in exported
    body = json.loads(as_json)
    assert body["key_digest"] == keys.key_digest("jane-roe-order-77")
    assert body["fingerprint"] == record.fingerprint
    assert body["argument_names"] == ["currency", "customer", "items"]
    assert "result" not in body and "arguments" not in body and body["error_message"] == ""
    assert body["operation_id"] == str(record.operation_id)


@pytest.mark.live
def test_the_live_server_streams_a_large_export_in_chunks(web_server, transactional_db):
    # given 6000 records (about 2 MB of CSV, many 64 KiB chunks) of one tenant, and 10 of another
    acme = access.create_tenant("acme", "ACME")
    globex = access.create_tenant("globex", "Globex")
    IdempotencyRecord.objects.bulk_create([_record(acme, i) for i in range(6000)] +
                                          [_record(globex, 10_000 + i) for i in range(10)])
    from tools_app.access import auditors

    _, raw = auditors.issue_key("firm", [acme], actor="system:test")

    # when the export is read over HTTP from uvicorn (the ASGI path)
    chunks = []
    with httpx2.Client(base_url=web_server.base_url, timeout=60) as http, http.stream(
            "GET", "/api/v1/idempotency-records/export.csv", params={"ordering": "created_at"},
            headers={"Authorization": f"Bearer {raw}"}) as response:
        assert response.status_code == 200
        assert response.headers["transfer-encoding"] == "chunked"
        assert "content-length" not in response.headers
        chunks = list(response.iter_bytes())

    # then every acme row arrives once, in order, and no globex row
    rows = list(csv.DictReader(io.StringIO(b"".join(chunks).decode())))
    assert len(rows) == 6000
    assert [row["key_digest"] for row in rows] == [keys.key_digest(f"k-{i}") for i in range(6000)]
    assert {row["tenant"] for row in rows} == {"acme"}


def _record(tenant, i):
    from datetime import timedelta
    from uuid import uuid4

    created = at(0) + timedelta(seconds=i)
    return IdempotencyRecord(tenant=tenant, tool="create_order", key=f"k-{i}", fingerprint="f" * 64,
                             field_digests={"customer": "d" * 64}, arguments={"customer": "x"},
                             status=RecordStatus.SUCCEEDED, result={"order_id": i}, operation_id=uuid4(),
                             actor="agent:acme/bot", created_at=created, updated_at=created, finished_at=created,
                             expires_at=created + timedelta(days=1))
