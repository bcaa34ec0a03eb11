"""A fingerprint covers what the caller sent: a deploy that gives a tool a new optional argument changes
nothing for keys in use, a record keeps the version it was fingerprinted under and is compared under
it, and a conflict names the nested field that differs.
"""

import pytest
from pydantic import Field

from tools_app.core.keys import FINGERPRINT_AS_SENT, FINGERPRINT_FILLED, digest
from tools_app.engine.models import IdempotencyRecord, RecordStatus
from tools_app.engine.operation import field_digests
from tools_app.toolkit import registry
from tools_app.toolkit.calls import call_tool, validate_arguments
from tools_app.toolkit.registry import StrictModel, ToolSpec, WriteInput, get_tool

ORDER = {"customer": "ACME", "currency": "EUR", "items": [
    {"sku": "BOLT-1", "quantity": 3, "unit_price": "2.50"},
    {"sku": "NUT-2", "quantity": 10, "unit_price": "0.20"},
    {"sku": "WASHER-3", "quantity": 5, "unit_price": "0.05"},
]}


class Line(StrictModel):
    sku: str
    quantity: int


class RestockBefore(WriteInput):
    warehouse: str
    lines: list[Line]


class LineAfter(Line):
    unit: str = "piece"  # the deploy's new optional argument, inside every line


class RestockAfter(WriteInput):
    warehouse: str
    lines: list[LineAfter]
    urgent: bool = Field(False, description="The deploy's new optional argument.")


class Restocked(StrictModel):
    restock: int


@pytest.fixture
def declare(monkeypatch):
    """Declare a tool for this test only, or swap its declaration (a deploy between two calls)."""
    monkeypatch.setattr(registry, "_TOOLS", dict(registry._TOOLS))

    def declare(input_model, executed: list) -> ToolSpec:
        registry._TOOLS.pop("restock", None)

        def restock(ctx, args):
            executed.append(args)
            return {"restock": len(executed)}

        return registry.register(ToolSpec(
            name="restock", title="Restock", description="Restock a warehouse.", input_model=input_model,
            output_model=Restocked, handler=restock, writes=True, personal_fields=frozenset()))

    return declare


def test_a_tool_gaining_an_optional_argument_between_two_calls_of_one_key_replays_the_first(caller, declare):
    executed = []
    arguments = {"warehouse": "north", "lines": [{"sku": "BOLT-1", "quantity": 40}], "idempotency_key": "r-1"}
    first = call_tool(declare(RestockBefore, executed), caller, arguments)

    # the deploy: the tool takes `urgent` and each line a `unit`, both with a default
    again = call_tool(declare(RestockAfter, executed), caller, arguments)

    assert first.error is None and again.error is None, again.error
    assert again.replayed and again.result == first.result == {"restock": 1}
    assert len(executed) == 1
    record = IdempotencyRecord.objects.get(tool="restock")
    assert (record.status, record.attempts, record.fingerprint_version) == (RecordStatus.SUCCEEDED, 1,
                                                                            FINGERPRINT_AS_SENT)


def test_an_argument_the_new_declaration_added_still_makes_another_operation_when_sent(caller, declare):
    executed = []
    arguments = {"warehouse": "north", "lines": [{"sku": "BOLT-1", "quantity": 40}], "idempotency_key": "r-1"}
    call_tool(declare(RestockBefore, executed), caller, arguments)
    declare(RestockAfter, executed)

    urgent = call_tool(get_tool("restock"), caller, {**arguments, "urgent": True})
    in_boxes = call_tool(get_tool("restock"), caller, {
        **arguments, "lines": [{"sku": "BOLT-1", "quantity": 40, "unit": "box"}]})

    assert urgent.error.error_class == "conflict" and urgent.error.differing_fields == ["urgent"]
    assert in_boxes.error.error_class == "conflict" and in_boxes.error.differing_fields == ["lines[0].unit"]
    assert len(executed) == 1


def test_a_conflict_names_the_nested_field_that_differs(caller):
    call_tool(get_tool("create_order"), caller, {**ORDER, "idempotency_key": "o-1"})
    items = [dict(item) for item in ORDER["items"]]
    items[2]["quantity"] = 6
    more = call_tool(get_tool("create_order"), caller, {**ORDER, "items": items, "idempotency_key": "o-1"})
    longer = call_tool(get_tool("create_order"), caller, {
        **ORDER, "items": [*ORDER["items"], {"sku": "PIN-4", "quantity": 1, "unit_price": "0.10"}],
        "idempotency_key": "o-1"})

    assert more.error.error_class == "conflict" and more.error.differing_fields == ["items[2].quantity"]
    assert "items[2].quantity" in more.error.message
    assert longer.error.differing_fields == ["items[3]"]


def test_a_purged_record_names_only_the_top_level_field(caller):
    call_tool(get_tool("create_order"), caller, {**ORDER, "idempotency_key": "o-1"})
    IdempotencyRecord.objects.update(arguments={}, result={"order_id": 1}, purged_at="2026-01-01T00:00:00Z")
    items = [dict(item) for item in ORDER["items"]]
    items[2]["quantity"] = 6

    other = call_tool(get_tool("create_order"), caller, {**ORDER, "items": items, "idempotency_key": "o-1"})

    assert other.error.error_class == "conflict" and other.error.differing_fields == ["items"]


def test_a_record_fingerprinted_before_versions_is_compared_as_it_was_fingerprinted(caller, declare):
    executed = []
    spec = declare(RestockAfter, executed)
    arguments = {"warehouse": "north", "lines": [{"sku": "BOLT-1", "quantity": 40}], "idempotency_key": "r-1"}
    first = call_tool(spec, caller, arguments)
    # As a record claimed before this deploy: every default filled in, version 1.
    filled = spec.business_arguments(validate_arguments(spec, arguments), FINGERPRINT_FILLED)
    IdempotencyRecord.objects.update(fingerprint=digest(filled), field_digests=field_digests(filled),
                                     arguments=filled, fingerprint_version=FINGERPRINT_FILLED)

    again = call_tool(spec, caller, arguments)
    other = call_tool(spec, caller, {**arguments, "lines": [{"sku": "BOLT-1", "quantity": 41}]})

    assert filled == {"warehouse": "north", "lines": [{"sku": "BOLT-1", "quantity": 40, "unit": "piece"}],
                      "urgent": False}
    assert again.error is None and again.replayed and again.result == first.result
    assert other.error.error_class == "conflict" and other.error.differing_fields == ["lines[0].quantity"]
    assert len(executed) == 1


def test_a_counted_default_sent_or_left_out_is_one_operation(caller):
    spec = get_tool("create_ticket")
    arguments = {"subject": "Printer", "body": "Jammed", "idempotency_key": "t-1"}
    first = call_tool(spec, caller, arguments)

    said = call_tool(spec, caller, {**arguments, "priority": "normal"})
    higher = call_tool(spec, caller, {**arguments, "priority": "high"})

    assert said.error is None and said.replayed and said.result == first.result
    assert higher.error.error_class == "conflict" and higher.error.differing_fields == ["priority"]
    assert IdempotencyRecord.objects.get().fingerprint_version == spec.fingerprint_version == FINGERPRINT_AS_SENT + 1
