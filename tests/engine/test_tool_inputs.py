"""Bad input, sent raw to the real /mcp endpoint: always `invalid_input` naming the field, and no key claimed.

The SDK's client would never send most of these, so the tests POST JSON-RPC
bytes to a live uvicorn (tests.support.mcp_client.raw_call).
"""

import asyncio
import typing
from decimal import Decimal

import pytest
from django.db import DataError
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel

from idemops_demo.models import Order
from tests.support.mcp_client import connect, post_raw, raw_call, raw_error_of
from tools_app import engine
from tools_app.core.errors import InvalidInput
from tools_app.engine import Operation
from tools_app.models import IdempotencyRecord, RecordStatus, Task
from tools_app.toolkit.calls import validate_arguments
from tools_app.toolkit.pipelines import Pipeline, Step
from tools_app.toolkit.registry import StrictModel, all_tools

ORDER = {"customer": "ACME", "items": [{"sku": "BOLT-1", "quantity": 3, "unit_price": "2.50"}], "currency": "EUR"}


def order(key, **changes):
    return {**ORDER, "idempotency_key": key, **changes}


def item(**changes):
    return [{**ORDER["items"][0], **changes}]


def assert_refused(answer, *fields, error_class="invalid_input"):
    error = raw_error_of(answer)
    assert error["class"] == error_class, error
    for field in fields:
        assert field in error["message"], (field, error["message"])
    assert IdempotencyRecord.objects.count() == 0, "invalid input must not claim a key"
    return error


# --- ranges ---------------------------------------------------------------------------------------


@pytest.mark.live
def test_an_order_total_beyond_the_total_column_is_invalid_input_and_the_key_stays_free(web_server, token):
    huge = item(quantity=10_000, unit_price="9999999999.99")

    error = assert_refused(raw_call(web_server.mcp_url, token, "create_order", order("big", items=huge)), "items")

    assert "999999999999.99" in error["message"]
    fixed = raw_call(web_server.mcp_url, token, "create_order", order("big"))
    assert not fixed["result"]["isError"] and Order.objects.count() == 1


@pytest.mark.live
@pytest.mark.parametrize(("tool", "arguments", "field"), [
    ("get_order", {"order_id": 2**63}, "order_id"),
    ("delete_record", {"kind": "order", "id": 2**63, "reason": "x", "idempotency_key": "d"}, "id"),
    ("create_order", order("p", items=item(unit_price="12345678901.00")), "items.0.unit_price"),
    ("create_order", order("p", items=item(unit_price="2.505")), "items.0.unit_price"),
])
def test_values_beyond_their_columns_are_invalid_input_naming_the_field(web_server, token, tool, arguments, field):
    assert_refused(raw_call(web_server.mcp_url, token, tool, arguments), field)


def test_a_database_data_error_is_invalid_input_and_is_not_run_again(tenant):
    # given: a handler whose write PostgreSQL refuses (numeric field overflow), past any validation
    runs = []

    def overflow(record):
        runs.append(record.pk)
        Order.objects.create(tenant=tenant, record=record, customer="ACME", currency="EUR", total=Decimal("1e13"))
        return {}

    op = Operation(tenant_id=tenant.pk, tool="create_order", key="k", arguments={"n": 1}, actor="agent:acme/test")

    # when
    first = engine.run(op, overflow)
    again = engine.run(op, overflow)

    # then: not `transient` ("retry with the same key"), and the retry replays the refusal
    assert first.error.error_class == again.error.error_class == "invalid_input"
    assert "NumericValueOutOfRange" in first.error.message
    assert (IdempotencyRecord.objects.get().status, len(runs)) == (RecordStatus.FAILED, 1)


def test_a_database_data_error_in_a_task_step_fails_it_without_retrying():
    pipeline = Pipeline(steps=(Step("only", lambda ctx: None),))

    failure = pipeline.classify(DataError("numeric field overflow"))

    assert failure.error_class == "invalid_input" and not failure.retryable


# --- characters PostgreSQL cannot store --------------------------------------------------------------


@pytest.mark.live
@pytest.mark.parametrize(("tool", "arguments", "field"), [
    ("create_order", order("n1", customer="AC\x00ME"), "customer"),
    ("create_order", order("n2", items=item(sku="BOLT\x00")), "items.0.sku"),
    ("create_order", order("n3", trace_id="t\x00"), "trace_id"),
    ("request_payment", {"amount": "1.00", "currency": "EUR", "payee": "Bob\x00", "idempotency_key": "n4"}, "payee"),
    ("search_documents", {"query": "harbor\x00"}, "query"),
    ("send_notification", {"channel": "email", "recipient": "ops@example.com", "subject": "s\x00", "body": "b",
                           "idempotency_key": "n5"}, "subject"),
    ("get_notification", {"notification_id": "\x00"}, "notification_id"),
    ("start_task", {"tool": "ingest_document", "arguments": {"text": "a\x00b"}, "idempotency_key": "n6"},
     "arguments"),
    ("resume_task", {"task_id": "x", "input": {"te\x00xt": "a"}, "idempotency_key": "n7"}, "input"),
])
def test_a_nul_character_in_any_string_is_invalid_input_naming_the_field(web_server, token, tool, arguments, field):
    error = assert_refused(raw_call(web_server.mcp_url, token, tool, arguments), field)

    assert "cannot be stored" in error["message"]


# --- strict types, no unknown fields ---------------------------------------------------------------


@pytest.mark.live
@pytest.mark.parametrize("quantity", [True, "3", 3.0, None])
def test_a_quantity_must_be_a_json_integer(web_server, token, quantity):
    answer = raw_call(web_server.mcp_url, token, "create_order", order("q", items=item(quantity=quantity)))

    assert_refused(answer, "items.0.quantity")


@pytest.mark.live
@pytest.mark.parametrize(("tool", "arguments", "field"), [
    ("get_order", {"order_id": "1"}, "order_id"),
    ("search_documents", {"query": "x", "limit": True}, "limit"),
    ("get_document", {"document_id": 1, "include_text": "yes"}, "include_text"),
    ("create_ticket", {"subject": 1, "body": "b", "idempotency_key": "t"}, "subject"),
    ("create_order", order("m", items=item(unit_price=True)), "items.0.unit_price"),
])
def test_every_tool_takes_strict_types(web_server, token, tool, arguments, field):
    assert_refused(raw_call(web_server.mcp_url, token, tool, arguments), field)


@pytest.mark.live
@pytest.mark.parametrize("unit_price", ["2.50", 2.5])
def test_money_is_a_decimal_string_or_a_json_number(web_server, token, unit_price):
    answer = raw_call(web_server.mcp_url, token, "create_order", order("money", items=item(unit_price=unit_price)))

    assert not answer["result"]["isError"]
    assert answer["result"]["structuredContent"]["total"] == "7.50"


@pytest.mark.live
@pytest.mark.parametrize(("arguments", "field"), [
    (order("x1", items=item(colour="red")), "items.0.colour"),
    (order("x2", colour="red"), "colour"),
])
def test_unknown_fields_are_refused_at_every_level(web_server, token, arguments, field):
    error = assert_refused(raw_call(web_server.mcp_url, token, "create_order", arguments), field)

    assert "Extra inputs are not permitted" in error["message"]


def _models_in(annotation) -> list[type[BaseModel]]:
    """Every pydantic model a field's type can hold (list[...], X | None, Annotated[...] included)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation, *(m for field in annotation.model_fields.values() for m in _models_in(field.annotation))]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


@pytest.mark.parametrize("spec", all_tools(), ids=lambda spec: spec.name)
def test_every_model_a_tool_reads_arguments_into_is_strict_and_forbids_unknown_fields(spec):
    models = _models_in(spec.input_model)

    for model in models:
        assert issubclass(model, StrictModel), f"{spec.name}: {model.__name__} must be a StrictModel"
        assert (model.model_config["extra"], model.model_config["strict"]) == ("forbid", True), model.__name__
    with pytest.raises(InvalidInput, match="__unknown__: Extra inputs are not permitted"):
        validate_arguments(spec, {"__unknown__": 1})


# --- the envelope: unknown tools, malformed ids ---------------------------------------------------------


@pytest.mark.live
def test_an_unknown_tool_is_a_protocol_error_classed_not_found(web_server, token):
    async def call_unknown():
        async with connect(web_server.mcp_url, token) as client:
            try:
                await client.call_tool("drop_tables", {})
            except MCPError as exc:
                return exc.error

    error = asyncio.run(call_unknown())

    # The MCP spec's answer for an unknown tool (-32602), with our class in its data.
    assert error is not None and error.code == -32602
    assert error.data["class"] == "not_found" and "drop_tables" in error.data["message"]


@pytest.mark.live
@pytest.mark.parametrize("request_id", [{"a": 1}, [1], True, None, 1.5])
def test_a_request_whose_id_is_not_a_string_or_integer_is_an_invalid_request(web_server, token, request_id):
    response = post_raw(web_server.mcp_url, token, {"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
                                                    "params": {"name": "create_order", "arguments": order("id")}})

    assert response.status_code == 400
    answer = response.json()
    assert answer["id"] is None and answer["error"]["code"] == -32600
    assert answer["error"]["data"]["class"] == "invalid_input" and "id" in answer["error"]["data"]["message"]
    assert IdempotencyRecord.objects.count() == 0


@pytest.mark.live
def test_a_request_with_a_bad_id_and_no_token_is_still_401(web_server, transactional_db):
    response = post_raw(web_server.mcp_url, "not-a-token", {"jsonrpc": "2.0", "id": {}, "method": "tools/list"})

    assert response.status_code == 401


# --- start_task validates before claiming ---------------------------------------------------------------


@pytest.mark.live
def test_a_typo_in_start_task_arguments_leaves_the_key_free_for_the_corrected_call(web_server, token):
    typo = raw_call(web_server.mcp_url, token, "start_task",
                    {"tool": "ingest_document", "arguments": {"txt": "Hello."}, "idempotency_key": "doc-1"})
    assert_refused(typo, "txt")

    fixed = raw_call(web_server.mcp_url, token, "start_task",
                     {"tool": "ingest_document", "arguments": {"text": "Hello."}, "idempotency_key": "doc-1"})

    assert not fixed["result"]["isError"], fixed
    assert str(Task.objects.get().pk) == fixed["result"]["structuredContent"]["task_id"]


@pytest.mark.live
@pytest.mark.parametrize(("tool", "arguments", "field", "error_class"), [
    ("start_task", {"tool": "create_order", "arguments": {}, "idempotency_key": "s1"}, "tool", "invalid_input"),
    ("start_task", {"tool": "no_such_tool", "arguments": {}, "idempotency_key": "s2"}, "tool", "not_found"),
    ("start_task", {"tool": "ingest_document", "arguments": {"text": "a", "idempotency_key": "k"},
                    "idempotency_key": "s3"}, "arguments", "invalid_input"),
    ("start_task", {"tool": "ingest_document", "arguments": {"url": "http://127.0.0.1:1/x"},
                    "idempotency_key": "s4"}, "url", "invalid_input"),
    ("ingest_document", {"url": "http://127.0.0.1:1/x", "idempotency_key": "s5"}, "url", "invalid_input"),
])
def test_a_long_tool_call_refused_by_its_checks_claims_no_key(web_server, token, tool, arguments, field,
                                                              error_class):
    assert_refused(raw_call(web_server.mcp_url, token, tool, arguments), field, error_class=error_class)
