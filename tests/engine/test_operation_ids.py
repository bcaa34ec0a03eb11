"""Server-issued operation ids: prepare_operation issues them, high-risk tools accept no other key.

In-process against real PostgreSQL, through toolkit.calls.call_tool (the MCP server's path).
publish_announcement stands for the high-risk tools (it needs no downstream process); the
payment's own path is in tests/engine/test_operation_id_everywhere.py.
"""

from datetime import datetime, timedelta

import pytest
from django.utils import timezone

from tests.support.approvals_support import STAFF_NOTE
from tools_app import engine
from tools_app.core.errors import InvalidInput
from tools_app.models import AuditEvent, IdempotencyRecord, PreparedOperation, RecordStatus
from tools_app.toolkit.calls import Caller, call_tool, validate_arguments, write_operation
from tools_app.toolkit.registry import get_tool


def prepare(caller, tool="publish_announcement", arguments=None, key="prep-1"):
    return call_tool(get_tool("prepare_operation"), caller,
                     {"tool": tool, "arguments": STAFF_NOTE if arguments is None else arguments,
                      "idempotency_key": key})


def issued(caller, **kwargs) -> str:
    prepared = prepare(caller, **kwargs)
    assert prepared.error is None, prepared.error
    return prepared.result["operation_id"]


def publish(caller, key, **overrides):
    return call_tool(get_tool("publish_announcement"), caller, {**STAFF_NOTE, **overrides, "idempotency_key": key})


def records_of(tool="publish_announcement"):
    return IdempotencyRecord.objects.filter(tool=tool)


def time_passes(record_id, **fields):
    IdempotencyRecord.objects.filter(pk=record_id).update(expires_at=timezone.now() - timedelta(minutes=1), **fields)


# --- issuing and using -------------------------------------------------------------------------


def test_a_high_risk_call_runs_under_the_operation_id_prepare_operation_issued(caller):
    operation_id = issued(caller)

    result = publish(caller, operation_id)

    record = records_of().get()
    assert result.error.error_class == "pending_approval"
    assert str(record.operation_id) == record.key == operation_id
    assert AuditEvent.objects.filter(action="record.claimed", object_id=str(record.pk)).get().operation_id == \
        record.operation_id


def test_a_key_the_model_made_up_is_refused_before_anything_is_claimed(caller):
    for key in ("pay-invoice-7", "6f1c3e2a-0000-4000-8000-000000000000"):
        result = publish(caller, key)

        assert result.error.error_class == "invalid_input" and result.error.details["operation_id_required"]
        assert "prepare_operation" in result.error.message
    assert not records_of().exists() and not AuditEvent.objects.filter(action="record.claimed").exists()


def test_an_issued_id_spelled_otherwise_is_another_key_and_refused(caller):
    operation_id = issued(caller)

    result = publish(caller, operation_id.upper())

    assert result.error.error_class == "invalid_input" and result.error.details["operation_id_required"]
    assert not records_of().exists()


def test_an_id_issued_for_other_arguments_is_a_conflict_naming_the_fields_and_claims_nothing(caller):
    operation_id = issued(caller)

    result = publish(caller, operation_id, body="Down at 3am", audience="everyone")

    assert result.error.error_class == "conflict" and result.error.differing_fields == ["audience", "body"]
    assert not records_of().exists()


def test_once_used_the_id_is_the_operations_key_a_retry_follows_and_other_arguments_conflict(caller):
    operation_id = issued(caller)
    first = publish(caller, operation_id)

    again = publish(caller, operation_id, trace_id="another-turn")
    other = publish(caller, operation_id, body="Down at 3am")

    assert first.error.error_class == again.error.error_class == "pending_approval" and again.replayed
    assert other.error.error_class == "conflict" and other.error.differing_fields == ["body"]
    assert records_of().count() == 1


def test_an_id_issued_to_another_tenant_or_for_another_tool_is_refused(caller, other_tenant):
    theirs = issued(Caller(other_tenant.pk, "agent:globex/x"))
    order = call_tool(get_tool("create_order"), caller, {"customer": "ACME", "currency": "EUR", "idempotency_key": "o",
                                                          "items": [{"sku": "A", "quantity": 1, "unit_price": "1"}]})
    for_deletion = issued(caller, tool="delete_record", key="prep-d",
                          arguments={"kind": "order", "id": order.result["order_id"], "reason": "duplicate"})

    assert publish(caller, theirs).error.details["operation_id_required"]
    assert publish(caller, for_deletion).error.details["operation_id_required"]
    assert not records_of().exists()


# --- prepare_operation itself ------------------------------------------------------------------


def test_preparing_again_with_the_same_key_answers_the_same_id_even_for_another_note_or_trace(caller):
    first = prepare(caller)
    again = prepare(caller, arguments={**STAFF_NOTE, "trace_id": "turn-8"})
    other = prepare(caller, arguments={**STAFF_NOTE, "body": "Down at 3am"})

    assert again.replayed and again.result["operation_id"] == first.result["operation_id"]
    assert other.error.error_class == "conflict" and other.error.differing_fields == ["arguments.body"]
    assert PreparedOperation.objects.count() == 1


def test_the_id_is_bound_to_tenant_tool_and_business_arguments_until_it_expires(caller, tenant):
    before = timezone.now()
    result = prepare(caller).result

    prepared = PreparedOperation.objects.get()
    assert str(prepared.operation_id) == result["operation_id"] and result["tool"] == "publish_announcement"
    assert (prepared.tenant_id, prepared.tool, prepared.actor) == (tenant.pk, "publish_announcement", caller.actor)
    assert prepared.fingerprint == publish_fingerprint(caller)
    lifetime = datetime.fromisoformat(result["expires_at"]) - before
    assert timedelta(minutes=59) < lifetime <= timedelta(hours=1, seconds=5)


def publish_fingerprint(caller) -> str:
    spec = get_tool("publish_announcement")
    operation, _ = write_operation(spec, caller, validate_arguments(spec, {**STAFF_NOTE, "idempotency_key": "x"}))
    return operation.fingerprint


@pytest.mark.parametrize(("tool", "arguments", "field"), [
    ("create_order", {"customer": "A", "currency": "EUR", "items": [{"sku": "A", "quantity": 1, "unit_price": "1"}]},
     "tool: 'create_order' does not take an issued operation id"),
    ("pay_everyone", {}, "tool: 'pay_everyone' is not a tool"),
    ("publish_announcement", {**STAFF_NOTE, "audience": "the moon"}, "audience"),
    ("publish_announcement", {**STAFF_NOTE, "idempotency_key": "mine"}, "arguments.idempotency_key"),
    ("publish_announcement", {**STAFF_NOTE, "colour": "red"}, "colour"),
])
def test_prepare_operation_refuses_what_the_tool_would_refuse_naming_the_field(caller, tool, arguments, field):
    result = prepare(caller, tool=tool, arguments=arguments)

    assert result.error.error_class == "invalid_input" and field in result.error.message
    assert not IdempotencyRecord.objects.exists() and not PreparedOperation.objects.exists()


# --- lifetimes ---------------------------------------------------------------------------------


def test_an_id_that_expired_unused_is_refused_and_preparing_again_issues_a_new_one(caller):
    first = prepare(caller)
    time_passes(first.record.pk)  # the id's time runs out with its prepare call's retention

    refused = publish(caller, first.result["operation_id"])
    again = prepare(caller)

    assert refused.error.error_class == "invalid_input" and "expired unused" in refused.error.message
    assert again.result["operation_id"] != first.result["operation_id"] and not again.replayed
    assert publish(caller, again.result["operation_id"]).error.error_class == "pending_approval"


def test_preparing_again_after_the_ids_time_ran_out_answers_the_id_of_the_operation_that_runs_under_it(caller):
    # given an agent that prepared and called, then lost its ledger for longer than the id's time
    first = prepare(caller)
    publish(caller, first.result["operation_id"])
    time_passes(first.record.pk)

    # when it plans the same call again: the same prepare key, the same arguments
    again = prepare(caller)

    # then it is told the same operation, never a second one
    assert again.result["operation_id"] == first.result["operation_id"] and not again.replayed
    assert publish(caller, again.result["operation_id"]).replayed and records_of().count() == 1


def test_an_id_whose_operation_was_retired_names_no_new_operation(caller):
    operation_id = issued(caller)
    publish(caller, operation_id)
    record = records_of().get()
    time_passes(record.pk, status=RecordStatus.FAILED, error_class="permission_denied", finished_at=timezone.now())

    expired = publish(caller, operation_id)  # the engine retires the record: REEXECUTE would run it anew
    later = publish(caller, operation_id)

    for result in (expired, later):
        assert result.error.error_class == "invalid_input" and result.error.details["operation_id_required"]
        assert "retention has ended" in result.error.message
    assert records_of().count() == 1 and records_of().get().retired_at is not None


def test_the_claim_refuses_an_issued_id_whose_record_was_retired_between_the_check_and_the_claim(caller):
    operation_id = issued(caller)
    publish(caller, operation_id)
    record = records_of().get()
    IdempotencyRecord.objects.filter(pk=record.pk).update(retired_at=timezone.now())
    operation = engine.Operation(tenant_id=caller.tenant_id, tool=record.tool, key=record.key,
                                 arguments=record.arguments, operation_id=record.operation_id)

    with pytest.raises(InvalidInput, match="retention has ended"):
        engine.claim(operation)
    assert records_of().count() == 1
