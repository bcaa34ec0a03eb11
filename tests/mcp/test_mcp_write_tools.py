"""create_order / create_ticket through a real uvicorn process and the SDK's client."""

import asyncio
import json
from datetime import timedelta

import httpx2
import pytest
from django.utils import timezone

from idemops_demo.models import Order, Ticket
from tests.support.mcp_client import call, call_sync, connect, error_of
from tools_app.models import IdempotencyRecord, RecordStatus

pytestmark = pytest.mark.live

ORDER = {"customer": "ACME", "items": [{"sku": "BOLT-1", "quantity": 3, "unit_price": "2.50"}], "currency": "EUR"}


def test_fifty_concurrent_identical_calls_create_one_order(web_server, token):
    async def fifty():
        return await asyncio.gather(*(call(web_server.mcp_url, token, "create_order",
                                           {**ORDER, "idempotency_key": "order-50"}) for _ in range(50)))

    results = asyncio.run(fifty())

    assert Order.objects.count() == 1
    order = Order.objects.get()
    assert [r.is_error for r in results] == [False] * 50
    assert {r.structured_content["order_id"] for r in results} == {order.pk}
    assert sum(not r.structured_content["idempotency"]["replayed"] for r in results) == 1
    assert order.total == 7.5 and order.lines.count() == 1


def test_a_replay_reads_exactly_like_the_first_answer_and_is_marked(web_server, token):
    first = call_sync(web_server.mcp_url, token, "create_order", {**ORDER, "idempotency_key": "o-1"})
    again = call_sync(web_server.mcp_url, token, "create_order", {**ORDER, "idempotency_key": "o-1"})

    def without_marker(result):
        content = dict(result.structured_content)
        content["idempotency"] = {**content["idempotency"], "replayed": None}
        return content

    assert without_marker(first) == without_marker(again)
    assert first.content[0].text.replace('"replayed": false', '"replayed": true') == again.content[0].text
    assert (first.meta["io.idemops/replayed"], again.meta["io.idemops/replayed"]) == (False, True)
    assert again.structured_content["idempotency"]["replayed"] is True
    assert first.structured_content["idempotency"]["expires_at"] == again.meta["io.idemops/expires-at"]


def test_the_same_key_with_another_item_is_a_conflict_naming_the_items_fields(web_server, token):
    call_sync(web_server.mcp_url, token, "create_order", {**ORDER, "idempotency_key": "o-2"})

    result = call_sync(web_server.mcp_url, token, "create_order", {
        **ORDER, "items": [{"sku": "NUT-9", "quantity": 1, "unit_price": 1}], "idempotency_key": "o-2"})

    error = error_of(result)
    assert error["class"] == "conflict"
    assert error["differing_fields"] == ["items[0].quantity", "items[0].sku", "items[0].unit_price"]
    assert "NUT-9" not in json.dumps(result.structured_content)
    assert Order.objects.count() == 1


def test_a_non_business_field_does_not_change_the_operation(web_server, token):
    first = call_sync(web_server.mcp_url, token, "create_order", {**ORDER, "idempotency_key": "o-3", "trace_id": "a"})
    again = call_sync(web_server.mcp_url, token, "create_order", {**ORDER, "idempotency_key": "o-3", "trace_id": "b"})

    assert again.structured_content["order_id"] == first.structured_content["order_id"]
    assert again.structured_content["idempotency"]["replayed"] is True


def test_the_key_may_come_in_meta(web_server, token):
    meta = {"io.idemops/idempotency-key": "o-meta"}
    first = call_sync(web_server.mcp_url, token, "create_order", ORDER, meta=meta)
    again = call_sync(web_server.mcp_url, token, "create_order", {**ORDER, "idempotency_key": "o-meta"})

    assert not first.is_error
    assert again.structured_content["order_id"] == first.structured_content["order_id"]


def test_the_same_key_in_two_tenants_is_two_orders_and_tenants_cannot_read_each_other(
        web_server, token, other_token):
    mine = call_sync(web_server.mcp_url, token, "create_order", {**ORDER, "idempotency_key": "shared"})
    theirs = call_sync(web_server.mcp_url, other_token, "create_order", {**ORDER, "idempotency_key": "shared"})

    assert mine.structured_content["order_id"] != theirs.structured_content["order_id"]
    assert Order.objects.count() == 2
    stolen = call_sync(web_server.mcp_url, token, "get_order", {"order_id": theirs.structured_content["order_id"]})
    assert error_of(stolen)["class"] == "not_found"
    own = call_sync(web_server.mcp_url, token, "get_order", {"order_id": mine.structured_content["order_id"]})
    assert own.structured_content["total"] == "7.50"


def test_a_missing_key_is_invalid_input(web_server, token):
    error = error_of(call_sync(web_server.mcp_url, token, "create_order", ORDER))

    assert error["class"] == "invalid_input" and "idempotency_key is required" in error["message"]
    assert IdempotencyRecord.objects.count() == 0


def test_a_malformed_key_is_invalid_input_stating_the_rule(web_server, token):
    error = error_of(call_sync(web_server.mcp_url, token, "create_order", {**ORDER, "idempotency_key": "a b"}))

    assert error["class"] == "invalid_input" and "1-255 characters" in error["message"]


def test_bad_arguments_are_invalid_input_naming_the_field(web_server, token):
    error = error_of(call_sync(web_server.mcp_url, token, "create_order",
                               {**ORDER, "currency": "euro", "idempotency_key": "o-4"}))

    assert error["class"] == "invalid_input" and "currency" in error["message"]
    assert Order.objects.count() == 0


@pytest.mark.parametrize("token_value", [None, "idm_not-a-real-token", "garbage"])
def test_without_a_valid_token_mcp_answers_401(web_server, transactional_db, token_value):
    headers = {"Authorization": f"Bearer {token_value}"} if token_value else {}
    response = httpx2.post(web_server.mcp_url, headers={**headers, "Accept": "application/json, text/event-stream"},
                           json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})

    assert response.status_code == 401
    assert "Bearer" in response.headers["www-authenticate"]


def test_a_token_revoked_elsewhere_is_refused_by_the_web_process_once_its_cache_period_is_over(web_server, token):
    from tools_app import access
    from tools_app.conf import conf
    from tools_app.core import polling
    from tools_app.models import ApiToken

    assert call_sync(web_server.mcp_url, token, "get_order", {"order_id": 1}).structured_content is not None
    access.revoke_token(ApiToken.objects.get(), actor="user:test")

    def refused() -> bool:
        response = httpx2.post(web_server.mcp_url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                               headers={"Authorization": f"Bearer {token}",
                                        "Accept": "application/json, text/event-stream"})
        return response.status_code == 401

    # A ceiling a busy machine stays under, not the period itself: that the entry is trusted no longer than
    # the period is tests/access/test_token_cache.py's to show, with the entry made older instead of a sleep.
    assert polling.until(refused, seconds=conf().token_cache_seconds + 60, pause=0.1)


def test_tools_are_listed_with_truthful_annotations_and_the_key_required(web_server, token):
    async def list_tools():
        async with connect(web_server.mcp_url, token) as client:
            return {tool.name: tool for tool in (await client.list_tools()).tools}

    tools = asyncio.run(list_tools())

    create, read = tools["create_order"], tools["get_order"]
    assert "idempotency_key" in create.input_schema["required"]
    assert "idempotency" in create.output_schema["required"]
    assert "idempotency" not in read.output_schema["properties"]
    assert (create.annotations.read_only_hint, create.annotations.idempotent_hint) == (False, True)
    assert create.annotations.destructive_hint is False
    assert read.annotations.read_only_hint is True
    assert "idempotency_key" not in read.input_schema["properties"]


def test_create_ticket_is_idempotent_too(web_server, token):
    args = {"subject": "Printer", "body": "On fire", "priority": "urgent", "idempotency_key": "t-1"}
    first = call_sync(web_server.mcp_url, token, "create_ticket", args)
    again = call_sync(web_server.mcp_url, token, "create_ticket", args)

    assert first.structured_content["ticket_id"] == again.structured_content["ticket_id"]
    assert Ticket.objects.get().priority == "urgent"
    read = call_sync(web_server.mcp_url, token, "get_ticket", {"ticket_id": first.structured_content["ticket_id"]})
    assert read.structured_content["subject"] == "Printer"


def test_after_retention_create_order_runs_as_a_new_order(web_server, token):
    first = call_sync(web_server.mcp_url, token, "create_order", {**ORDER, "idempotency_key": "o-old"})
    IdempotencyRecord.objects.update(expires_at=timezone.now() - timedelta(seconds=1))

    again = call_sync(web_server.mcp_url, token, "create_order", {**ORDER, "idempotency_key": "o-old"})

    assert again.structured_content["order_id"] != first.structured_content["order_id"]
    assert again.structured_content["idempotency"]["replayed"] is False
    assert IdempotencyRecord.objects.filter(status=RecordStatus.SUCCEEDED).count() == 2
