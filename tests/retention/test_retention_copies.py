"""Retention purges every copy of a call's words: after the purge, no table of the database holds a
value of a declared personal argument, nor a raw idempotency key; the approvers' messages never
carried them in the first place. Real tools through the real call path, the real relay to the
notification sink, then a scan of every table."""

import json
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection
from django.urls import reverse

from idemops.conf import override_conf
from tests.approvals_support import pending_request
from tests.issued_ids import call_labelled
from tests.jobs import run_queued_jobs
from tests.operators import make_operator
from tools_app import approvals, outbox, retention
from tools_app.access.roles import APPROVER
from tools_app.core import audit, clock, keys
from tools_app.models import ApprovalRequest, ApprovalSettings, IdempotencyRecord, OutboxEvent, Task
from tools_app.toolkit.calls import call_tool
from tools_app.toolkit.registry import get_tool

CANARY = "cnry7f3e9c"
PUBLIC_URL = "https://ops.example.com"
# The effects the calls made, not copies of them: the business rows are the system of record.
ANNOUNCEMENT = {"title": f"Visit of {CANARY}", "body": f"Dear {CANARY}, welcome", "audience": "staff",
                "idempotency_key": "ann-1"}
EFFECTS = {"idemops_demo_announcement", "idemops_demo_order"}


def tables_holding(text: str) -> dict[str, int]:
    """Every table of the database (all its columns, as text) with how many of its rows contain `text`."""
    found = {}
    with connection.cursor() as cursor:
        cursor.execute("SELECT schemaname, tablename FROM pg_tables "
                       "WHERE schemaname NOT IN ('pg_catalog', 'information_schema')")
        for schema, table in cursor.fetchall():
            cursor.execute(f'SELECT count(*) FROM "{schema}"."{table}" AS t WHERE t::text ILIKE %s', [f"%{text}%"])
            if count := cursor.fetchone()[0]:
                found[table] = count
    return found


def sink_messages(sink) -> list[dict]:
    rows = sink.sql("SELECT channel, recipient, subject, body FROM messages ORDER BY first_received_at")
    return [dict(zip(["channel", "recipient", "subject", "body"], row, strict=True)) for row in rows]


@pytest.fixture
def alice(tenant):
    alice = make_operator("alice", APPROVER, tenant)
    alice.email = "alice@example.invalid"
    alice.save()
    return alice


@pytest.fixture
def webhook(tenant, sink, downstreams, settings):
    override_conf(settings, public_url=PUBLIC_URL)
    return ApprovalSettings.objects.create(tenant=tenant, notify_webhook_url=f"{sink.url}/webhooks/approvals")


def announce(caller) -> ApprovalRequest:
    """An announcement (it needs approval) whose title and body carry the canary."""
    return pending_request(call_labelled(caller, "publish_announcement", ANNOUNCEMENT))


def test_the_approvers_messages_carry_the_summary_without_personal_values_and_a_link_to_the_console(
        caller, alice, webhook, sink):
    request = announce(caller)
    assert CANARY in request.summary  # the console's queue shows it whole

    assert outbox.relay_batch().delivered == 2

    delivered = {message["channel"]: message for message in sink_messages(sink)}
    email, hook = delivered["email"], json.loads(delivered["webhook"]["body"])
    link = f"{PUBLIC_URL}{reverse('admin:approval_link', args=[request.pk])}"
    assert "Publish to staff: “[personal]” (24 characters)" in email["subject"] and link in email["body"]
    assert hook["data"]["summary"] == "Publish to staff: “[personal]” (24 characters)"
    assert hook["data"]["url"] == link
    assert CANARY not in json.dumps(delivered)


def test_after_retention_no_table_holds_a_personal_value_or_a_raw_key_and_the_chain_verifies(
        caller, alice, webhook, sink, gateway):
    # given calls whose personal arguments and keys carry the canary, with every copy they make:
    # an approved announcement (its request, the approvers' messages), an order, a notification,
    # a payment (the gateway's answer kept as evidence)
    request = announce(caller)
    approvals.approve(request, alice, reason="fine")
    run_queued_jobs()
    assert call_labelled(caller, "publish_announcement", ANNOUNCEMENT).error is None
    order = call_tool(get_tool("create_order"), caller, {
        "customer": CANARY, "currency": "EUR", "items": [{"sku": "BOLT-1", "quantity": 1, "unit_price": "2.50"}],
        "idempotency_key": f"order-{CANARY}"})
    assert order.error is None, order.error
    note = call_tool(get_tool("send_notification"), caller, {
        "channel": "email", "recipient": f"{CANARY}@example.invalid", "subject": f"Hi {CANARY}",
        "body": f"Hello {CANARY}", "idempotency_key": f"note-{CANARY}"})
    assert note.error is None, note.error
    paid = call_labelled(caller, "request_payment", {"amount": "12.00", "currency": "EUR", "payee": CANARY,
                                                      "reference": f"inv-{CANARY}", "idempotency_key": "p-1"})
    assert paid.error is None, paid.error
    outbox.relay_batch()
    assert {"tools_app_idempotencyrecord", "tools_app_approvalrequest", "tools_app_outboxevent"} \
        <= tables_holding(CANARY).keys()

    # when the database's clock is past every retention (a year and more) and the purge runs
    long_ago = clock.read() - timedelta(days=400)
    IdempotencyRecord.objects.update(finished_at=long_ago, expires_at=long_ago)
    Task.objects.update(finished_at=long_ago)
    retention.purge()

    # then no table holds the canary but the business rows the calls made, and no raw key is left
    assert tables_holding(CANARY).keys() <= EFFECTS, tables_holding(CANARY)
    for record in IdempotencyRecord.objects.all():
        assert record.key.startswith(keys.PURGED_KEY_PREFIX) and record.purged_at is not None, record.key
        assert all(set(entry) == {"at", "source"} for entry in record.evidence), record.evidence
    request.refresh_from_db()
    assert (request.arguments, request.summary) == ({}, "Publish to staff: “[personal]” (24 characters)")
    assert all(event.payload == {} for event in OutboxEvent.objects.all())
    # the keyed digest still finds the record (the console's and the auditors' search by key digest)
    order_record = IdempotencyRecord.objects.get(tool="create_order")
    assert keys.key_digest(order_record.key) == keys.key_digest(f"order-{CANARY}")
    assert list(keys.with_key_digest(IdempotencyRecord.objects.all(), keys.key_digest(f"order-{CANARY}"))) \
        == [order_record]

    # and get_operation still finds the operation by its key
    found = call_tool(get_tool("get_operation"), caller, {"tool": "create_order",
                                                          "idempotency_key": f"order-{CANARY}"})
    assert found.error is None and found.result["operation_id"] == str(order_record.operation_id), found.error

    # and the key, though purged, still follows its tool's expiry policy (create_order: runs again)
    again = call_tool(get_tool("create_order"), caller, {
        "customer": "ACME", "currency": "EUR", "items": [{"sku": "BOLT-1", "quantity": 1, "unit_price": "2.50"}],
        "idempotency_key": f"order-{CANARY}"})
    assert again.error is None and not again.replayed
    assert IdempotencyRecord.objects.get(pk=order_record.pk).retired_at is not None

    # and the audit chain, purge events included, still verifies
    audit.seal()
    assert audit.verify_chain().ok
    out = StringIO()
    call_command("verify_audit_log", stdout=out)
    assert out.getvalue().startswith("OK: ")
