"""One id names an operation everywhere: on the wire to the payment gateway, in every audit event, on the
task, the approval request and the outbox event; tools/list tells a client what it needs to key its calls;
declared non-business fields leave the operation as it is.
"""

import asyncio

import httpx2
import pytest

from tests.support.api_support import key_client
from tests.support.approvals_support import STAFF_NOTE
from tests.support.issued_ids import call_labelled
from tests.support.mcp_client import call_sync, connect
from tests.support.tasks_support import TEXT
from tools_app.models import ApprovalRequest, AuditEvent, IdempotencyRecord, OutboxEvent, Task
from tools_app.toolkit.calls import call_tool
from tools_app.toolkit.registry import get_tool

PAYMENT = {"amount": "42.50", "currency": "EUR", "payee": "ACME Supplies", "reference": "INV-7"}
ORDER = {"customer": "ACME", "currency": "EUR", "items": [{"sku": "BOLT-1", "quantity": 3, "unit_price": "2.50"}]}
EMAIL = {"channel": "email", "recipient": "ops@example.com", "subject": "Orders", "body": "Four orders were placed."}


def events_of(operation_id) -> list[str]:
    return list(AuditEvent.objects.filter(operation_id=operation_id).order_by("id").values_list("action", flat=True))


@pytest.mark.live
def test_tools_list_marks_the_high_risk_tools_and_the_declared_non_business_fields(web_server, token):
    async def list_tools():
        async with connect(web_server.mcp_url, token) as client:
            return {tool.name: tool for tool in (await client.list_tools()).tools}

    tools = asyncio.run(list_tools())

    flagged = {name for name, tool in tools.items() if (tool.meta or {}).get("io.idemops/requires-operation-id")}
    assert flagged == {"request_payment", "delete_record", "publish_announcement"}
    # (and the idempotency extension's declaration says the same: docs/extension/idempotency.md section 3)
    declared = {name: (tool.meta or {}).get("io.idemops/idempotency") for name, tool in tools.items()}
    assert {name for name, declaration in declared.items() if declaration and declaration["requiresOperationId"]} == (
        flagged)
    assert tools["create_order"].meta == {"io.idemops/non-business-fields": ["note"], "io.idemops/idempotency": {
        "key": "required", "requiresOperationId": False, "nonBusinessFields": ["note"], "retentionSeconds": 86400,
        "afterRetention": "new_operation"}}
    assert tools["send_notification"].meta["io.idemops/non-business-fields"] == ["sent_at"]
    assert declared["send_notification"]["nonBusinessFields"] == ["sent_at"]
    assert tools["get_operation"].annotations.read_only_hint is True and declared["get_operation"] is None
    assert tools["prepare_operation"].annotations.read_only_hint is False
    assert set(tools["prepare_operation"].meta) == {"io.idemops/idempotency"}
    assert declared["prepare_operation"]["requiresOperationId"] is False


@pytest.mark.live
def test_a_payment_carries_its_issued_operation_id_to_the_gateway_and_into_every_audit_event(
        web_server, token, downstreams, gateway):
    # given an agent that prepared the payment
    prepared = call_sync(web_server.mcp_url, token, "prepare_operation",
                         {"tool": "request_payment", "arguments": PAYMENT, "idempotency_key": "prep-1"})
    operation_id = prepared.structured_content["operation_id"]

    # when it pays with the issued id as its key
    paid = call_sync(web_server.mcp_url, token, "request_payment", {**PAYMENT, "idempotency_key": operation_id})

    # then the same id is the record's, the answer's, the gateway's and the audit log's
    record = IdempotencyRecord.objects.get(tool="request_payment")
    assert str(record.operation_id) == operation_id == paid.structured_content["idempotency"]["operation_id"]
    [(payment_id, gateway_operation_id, forwarded_key)] = gateway.sql(
        "SELECT id, operation_id, idempotency_key FROM payments")
    assert gateway_operation_id == operation_id and forwarded_key == record.downstream_key
    found = httpx2.get(f"{gateway.url}/payments", params={"operation_id": operation_id}).json()
    assert found["payment_id"] == payment_id == paid.structured_content["payment_id"]
    assert events_of(record.operation_id) == ["record.claimed", "record.succeeded"]
    assert record.evidence[-1]["asked"]["operation_id"] == operation_id


def test_a_task_and_its_audit_events_carry_the_operation_id_of_the_call_that_started_it(caller, fast):
    started = call_tool(get_tool("start_task"), caller, {"tool": "ingest_document", "arguments": {"text": TEXT},
                                                         "idempotency_key": "t-1"})

    task = Task.objects.get()
    assert task.operation_id == started.record.operation_id
    assert events_of(task.operation_id) == ["record.claimed", "task.created", "record.held_while_ongoing",
                                           "record.succeeded"]


def test_an_approval_request_and_an_outbox_event_carry_their_operation_id(caller):
    waiting = call_labelled(caller, "publish_announcement", {**STAFF_NOTE, "idempotency_key": "a-1"})
    sent = call_tool(get_tool("send_notification"), caller, {**EMAIL, "idempotency_key": "n-1"})

    request = ApprovalRequest.objects.get()
    assert request.operation_id == waiting.record.operation_id
    assert OutboxEvent.objects.get().operation_id == sent.record.operation_id
    assert events_of(request.operation_id) == ["record.claimed", "record.awaiting_approval", "approval.requested"]


def test_the_auditors_api_lists_every_event_of_one_operation(caller, tenant, fast):
    started = call_tool(get_tool("start_task"), caller, {"tool": "ingest_document", "arguments": {"text": TEXT},
                                                         "idempotency_key": "t-1"})
    call_tool(get_tool("create_order"), caller, {**ORDER, "idempotency_key": "o-1"})
    operation_id = str(started.record.operation_id)
    client = key_client(tenant)

    events = client.get("/api/v1/audit-events", {"operation_id": operation_id}).json()["results"]
    tasks = client.get("/api/v1/tasks", {"operation_id": operation_id}).json()["results"]

    assert sorted(e["action"] for e in events) == ["record.claimed", "record.held_while_ongoing", "record.succeeded",
                                                   "task.created"]
    assert {e["operation_id"] for e in events} == {operation_id}
    assert [t["operation_id"] for t in tasks] == [operation_id]


# --- non-business fields -----------------------------------------------------------------------


def test_an_orders_note_is_not_part_of_the_order_another_note_is_a_replay_not_a_conflict(caller):
    first = call_tool(get_tool("create_order"), caller, {**ORDER, "note": "for the Monday batch",
                                                         "idempotency_key": "o-1"})
    again = call_tool(get_tool("create_order"), caller, {**ORDER, "note": "re-planned: the Monday batch, again",
                                                         "idempotency_key": "o-1"})
    other = call_tool(get_tool("create_order"), caller, {**ORDER, "currency": "USD", "note": "x",
                                                         "idempotency_key": "o-1"})

    assert again.error is None and again.replayed and again.result["order_id"] == first.result["order_id"]
    assert other.error.error_class == "conflict" and other.error.differing_fields == ["currency"]
    assert "note" not in IdempotencyRecord.objects.get().arguments


def test_a_notifications_sent_at_is_not_part_of_the_notification_another_one_is_a_replay(caller):
    first = call_tool(get_tool("send_notification"), caller, {**EMAIL, "sent_at": "2026-11-30T10:00:00Z",
                                                              "idempotency_key": "n-1"})
    again = call_tool(get_tool("send_notification"), caller, {**EMAIL, "sent_at": "2026-11-30T10:00:07+01:00",
                                                              "idempotency_key": "n-1"})
    bad = call_tool(get_tool("send_notification"), caller, {**EMAIL, "sent_at": "yesterday", "idempotency_key": "n-2"})

    assert again.replayed and again.result["notification_id"] == first.result["notification_id"]
    assert OutboxEvent.objects.count() == 1 and "sent_at" not in OutboxEvent.objects.get().payload
    assert bad.error.error_class == "invalid_input" and "sent_at" in bad.error.message
