"""Structured logs in one process: what a line carries, and what never gets into one.

Lines are captured through the formatter every process uses (tools_app.core.logs.Formatter),
attached to the root logger as idemops/settings.py attaches it.
"""

from __future__ import annotations

import io
import json
import logging

import pytest

from tests.support.approvals_support import call, pending_request
from tools_app import approvals, reconciliation
from tools_app.access.roles import OPERATOR
from tools_app.core import keys, logs, redaction, tracing
from tools_app.core.errors import Refused
from tools_app.models import RecordStatus
from tools_app.toolkit.calls import observed
from tools_app.toolkit.registry import get_tool

STAFF_NOTE = {"title": "Maintenance", "body": "Down at 2am", "audience": "staff"}


class Captured:
    def __init__(self, kind: str = "json"):
        self.stream = io.StringIO()
        self.handler = logging.StreamHandler(self.stream)
        self.handler.setFormatter(logs.Formatter(kind=kind, stream=self.stream))

    @property
    def text(self) -> str:
        return self.stream.getvalue()

    def lines(self) -> list[dict]:
        return [json.loads(line) for line in self.text.splitlines()]

    def events(self, event: str) -> list[dict]:
        return [line for line in self.lines() if line["event"] == event]


@pytest.fixture
def captured():
    capture = Captured()
    root = logging.getLogger()
    root.addHandler(capture.handler)
    yield capture
    root.removeHandler(capture.handler)


# --- what a line carries -----------------------------------------------------------------------------


def test_a_line_logged_during_a_call_names_its_tenant_tool_and_trace(captured, tenant):
    spec = get_tool("create_order")
    with tracing.span("a call") as span, observed(spec, tenant.pk, {"customer": "ACME"}):
        logs.get("tools_app.test").info("something.happened", detail=3)
        logging.getLogger("some.library").warning("a library's own line")

    ours, theirs = captured.lines()
    trace_id, span_id = tracing.ids(span)
    assert ours["event"] == "something.happened" and ours["detail"] == 3 and ours["level"] == "info"
    for line in (ours, theirs):
        assert (line["tenant_id"], line["tool"], line["trace_id"], line["span_id"]) == (tenant.pk, "create_order",
                                                                                      trace_id, span_id)
        assert line["timestamp"].endswith("Z")
    assert theirs["event"] == "a library's own line" and theirs["logger"] == "some.library"


def test_text_for_a_terminal_is_one_readable_line_not_json(tenant):
    capture = Captured(kind="console")
    logging.getLogger().addHandler(capture.handler)
    try:
        logs.get("tools_app.test").info("tool.call", tool="whoami", outcome="executed")
    finally:
        logging.getLogger().removeHandler(capture.handler)

    assert "tool.call" in capture.text and "outcome=executed" in capture.text
    with pytest.raises(ValueError):
        json.loads(capture.text)


# --- what never gets into one ----------------------------------------------------------------------------


def test_the_calls_raw_key_and_personal_values_are_replaced_even_inside_a_traceback(captured, tenant):
    spec = get_tool("send_notification")
    arguments = {"recipient": "zelda.quill@example.test", "subject": "About Zelda", "body": "Zelda's diagnosis",
                 "channel": "email", "idempotency_key": "order-zelda-0001"}
    with observed(spec, tenant.pk, arguments, key=arguments["idempotency_key"]):
        try:
            raise RuntimeError(f"SMTP refused {arguments['recipient']} for key {arguments['idempotency_key']}")
        except RuntimeError:
            logging.getLogger("smtplib.like").exception("delivery of %s failed", arguments["subject"])

    text = captured.text
    for value in ("zelda.quill@example.test", "About Zelda", "order-zelda-0001"):
        assert value not in text
    line = captured.lines()[0]
    assert "RuntimeError" in line["exception"] and "[personal]" in line["exception"]
    assert f"[key {keys.key_digest('order-zelda-0001')}]" in line["exception"]


def test_a_high_risk_tools_issued_operation_id_stays_visible_while_its_personal_values_do_not(captured, tenant):
    # the key of publish_announcement is an operation id the server issued: an id, not the caller's words
    spec = get_tool("publish_announcement")
    issued = "6f1c2a9e-3b7d-4c8e-9a10-2b3c4d5e6f70"
    with observed(spec, tenant.pk, {**STAFF_NOTE, "idempotency_key": issued}, key=issued):
        logs.get("tools_app.test").info("tool.call", operation_id=issued, note=f"publishing {STAFF_NOTE['body']}")

    line = captured.events("tool.call")[0]
    assert line["operation_id"] == issued
    assert STAFF_NOTE["body"] not in captured.text


@pytest.mark.parametrize(("fields", "secret"), [
    ({"message": "presented Bearer idm_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789"}, "idm_AbCdEfGhIjKlMnOpQrStUv"),
    ({"message": "auditor ida_ZyXwVuTsRqPoNmLkJiHgFeDcBa9876543210 exported"}, "ida_ZyXwVuTsRqPoNmLkJiH"),
    ({"message": "Authorization: Bearer sk-live-4242424242"}, "sk-live-4242424242"),
    ({"message": "login with password=hunter2hunter2 failed"}, "hunter2hunter2"),
    ({"database": "postgres://idemops:s3cr3tpass@db.internal/idemops"}, "s3cr3tpass"),
    ({"message": "fetched https://docs.example/report.pdf?token=SIGNEDXYZ123 ok"}, "SIGNEDXYZ123"),
    ({"password": "correct-horse"}, "correct-horse"),
    ({"api_token": "opaque-value-17"}, "opaque-value-17"),
    ({"headers": {"Authorization": "Basic dXNlcjpwYXNz"}}, "dXNlcjpwYXNz"),
    ({"idempotency_key": "invoice-2026-0042"}, "invoice-2026-0042"),
    ({"arguments": {"customer": "Jane Roe", "items": []}}, "Jane Roe"),
    ({"payee": "Roe Consulting"}, "Roe Consulting"),
])
def test_secrets_and_personal_fields_never_reach_a_line(captured, fields, secret):
    logs.get("tools_app.test").info("something", **fields)

    assert secret not in captured.text
    assert captured.lines()[0]["event"] == "something"


def test_a_raw_idempotency_key_field_is_logged_as_its_keyed_digest(captured):
    logs.get("tools_app.test").info("something", idempotency_key="invoice-2026-0042")

    assert captured.lines()[0]["idempotency_key"] == f"[key {keys.key_digest('invoice-2026-0042')}]"


def test_every_personal_field_a_tool_declares_is_redacted_by_name():
    line = redaction.redact_log_line({name: "value-" + name for name in redaction.personal_fields()})

    assert set(line.values()) == {redaction.PERSONAL}
    assert {"customer", "payee", "recipient", "body", "text"} <= redaction.personal_fields()


def test_a_tool_that_does_not_declare_its_personal_fields_cannot_be_registered():
    from tools_app.toolkit.registry import ToolInput, ToolSpec, register

    spec = ToolSpec(name="undeclared", title="t", description="d", input_model=ToolInput,
                    output_model=ToolInput, handler=lambda ctx, args: {}, writes=False)
    with pytest.raises(TypeError, match="personal_fields"):
        register(spec)
    with pytest.raises(TypeError, match="does not take"):
        register(ToolSpec(name="undeclared", title="t", description="d", input_model=ToolInput,
                          output_model=ToolInput, handler=lambda ctx, args: {}, writes=False,
                          personal_fields=frozenset({"nickname"})))


# --- a line per operator action and per reconciliation ------------------------------------------------------


def test_an_operators_decision_and_a_refusal_are_each_one_line_once_committed(
        captured, caller, tenant, approver, django_capture_on_commit_callbacks):
    from tests.support.operators import make_operator

    request = pending_request(call(caller, "publish_announcement", idempotency_key="a-1", **STAFF_NOTE))
    outsider = make_operator("olga", OPERATOR, tenant)
    with django_capture_on_commit_callbacks(execute=True):
        approvals.approve(request, approver)
        with pytest.raises(Refused):
            approvals.reject(request, outsider, reason="no")

    actions = [(line["action"], line["actor"]) for line in captured.events("operator.action")]
    assert ("approval.approved", "user:bob") in actions
    assert [action for action, actor in actions if actor == "user:olga"] == ["approval.refused"]
    assert all(line["object_trace_id"] == request.trace_id for line in captured.events("operator.action")
               if line["actor"] == "user:bob")


def test_a_reconciliation_is_one_line_with_its_result(captured, caller, django_capture_on_commit_callbacks):
    result = call(caller, "create_order", idempotency_key="o-1", customer="ACME", currency="EUR",
                  items=[{"sku": "A", "quantity": 1, "unit_price": "1.00"}])
    record = result.record
    # As a dead executor leaves it (engine.expire_lease), without the wait for its lease.
    type(record).objects.filter(pk=record.pk).update(status=RecordStatus.UNKNOWN, next_reconcile_at=None)
    record.refresh_from_db()

    with django_capture_on_commit_callbacks(execute=True):
        outcome = reconciliation.reconcile_record(record)

    line = captured.events("reconciliation")[0]
    assert outcome == "failed"  # a local tool whose record is UNKNOWN never committed its effect
    assert (line["tool"], line["result"], line["operation_id"]) == ("create_order", "failed",
                                                                   str(record.operation_id))
    assert line["trace_id"] == record.trace_id  # reconciled in the trace of the call


def test_bound_fields_end_with_their_block_and_an_outer_value_comes_back():
    with logs.bound(tenant_id=1, tool="outer", ignored=None):
        with logs.bound(tool="inner", step="a"):
            assert logs.context() == {"tenant_id": 1, "tool": "inner", "step": "a"}
        assert logs.context() == {"tenant_id": 1, "tool": "outer"}
        with pytest.raises(RuntimeError), logs.bound(tool="failing"):
            raise RuntimeError
        assert logs.context() == {"tenant_id": 1, "tool": "outer"}
    assert logs.context() == {}
