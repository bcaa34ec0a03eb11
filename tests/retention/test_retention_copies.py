"""Retention purges every copy of a call's words: after the purge, no table of the database holds a
value of a declared personal argument, nor a raw idempotency key; the approvers' messages never
carried them in the first place. Real tools through the real call path (short tools, approvals, long
tasks with their webhooks), the real relay to the notification sink, then a scan of every text, JSON
and binary column of every table, found by asking the database's catalogue."""

import json
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection
from django.urls import reverse
from pydantic import Field

from idemops.tools import InvalidInput, Pipeline, Step, StrictModel, WriteInput, long_tool
from idemops_demo.models import Document
from tests.support.approvals_support import pending_request
from tests.support.issued_ids import call_labelled
from tests.support.jobs import run_queued_jobs
from tests.support.operators import make_operator
from tools_app import access, approvals, outbox, retention, scheduling
from tools_app.access.roles import APPROVER
from tools_app.conf import override_conf
from tools_app.core import audit, clock, keys, personal
from tools_app.models import ApprovalRequest, ApprovalSettings, IdempotencyRecord, OutboxEvent, Task, TaskStatus
from tools_app.tasks import jobs as task_jobs
from tools_app.tasks.waits import send_event
from tools_app.toolkit import registry
from tools_app.toolkit.calls import call_tool
from tools_app.toolkit.registry import get_tool

CANARY = "cnry7f3e9c"
PUBLIC_URL = "https://ops.example.com"
# The effects the calls made, not copies of them: the business rows are the system of record.
ANNOUNCEMENT = {"title": f"Visit of {CANARY}", "body": f"Dear {CANARY}, welcome", "audience": "staff",
                "idempotency_key": "ann-1"}
EFFECTS = {"idemops_demo_announcement", "idemops_demo_order"}
# The columns that store a tool's declared personal values encrypted (core.personal.PersonalJSONField), and
# the audit log's details, which never hold them in the first place.
ENCRYPTED = {"tools_app_idempotencyrecord.arguments", "tools_app_idempotencyrecord.result",
             "tools_app_idempotencyrecord.evidence", "tools_app_approvalrequest.arguments",
             "tools_app_outboxevent.payload", "tools_app_task.arguments", "tools_app_task.result",
             "tools_app_task.input_request", "tools_app_task.resume_input", "tools_app_stepbatch.output",
             "tools_app_checkpoint.output_inline", "tools_app_taskevent.payload",
             "tools_app_scheduledoperation.arguments", "tools_app_auditevent.before", "tools_app_auditevent.after"}
# Those this test's calls write personal values into (so they hold envelopes).
ENCRYPTED_HERE = {"tools_app_idempotencyrecord.arguments", "tools_app_idempotencyrecord.result",
                  "tools_app_idempotencyrecord.evidence", "tools_app_approvalrequest.arguments",
                  "tools_app_outboxevent.payload", "tools_app_task.arguments", "tools_app_checkpoint.output_inline",
                  "tools_app_taskevent.payload", "tools_app_scheduledoperation.arguments"}


# The columns that can hold words, by information_schema's data_type: text, JSON, bytes, and what casts to
# text (arrays, tsvector and the like: a search index's lexemes are words too).
SEARCHED_TYPES = ("text", "character varying", "character", "json", "jsonb", "bytea", "ARRAY", "USER-DEFINED",
                  "xml")


def columns_holding(text: str) -> dict[str, int]:
    """Every column of every table of the database (partitions included) that can hold words, with how many
    of its rows contain `text`: bytes searched as bytes (a row's text form shows them in hex), the rest as text."""
    found = {}
    with connection.cursor() as cursor:
        cursor.execute("SELECT c.table_schema, c.table_name, c.column_name, c.data_type "
                       "FROM information_schema.columns c JOIN information_schema.tables t "
                       "ON (t.table_schema, t.table_name) = (c.table_schema, c.table_name) "
                       "WHERE t.table_type = 'BASE TABLE' "
                       "AND c.table_schema NOT IN ('pg_catalog', 'information_schema') "
                       "AND c.data_type = ANY(%s) ORDER BY 1, 2, c.ordinal_position", [list(SEARCHED_TYPES)])
        columns = cursor.fetchall()
        assert {table for _, table, _, _ in columns} >= {"tools_app_task", "tools_app_steprun", "tools_app_outboxevent"}
        for schema, table, column, data_type in columns:
            condition = ('position(convert_to(%s, \'UTF8\') in t."{column}") > 0' if data_type == "bytea"
                         else 't."{column}"::text ILIKE %s').format(column=column)
            cursor.execute(f'SELECT count(*) FROM "{schema}"."{table}" AS t WHERE {condition}',
                           [text if data_type == "bytea" else f"%{text}%"])
            if count := cursor.fetchone()[0]:
                found[f"{table}.{column}"] = count
    return found


def tables_holding(text: str) -> dict[str, int]:
    """The tables of `columns_holding`, with the most rows any of their columns holds it in."""
    found: dict[str, int] = {}
    for name, count in columns_holding(text).items():
        table = name.split(".")[0]
        found[table] = max(found.get(table, 0), count)
    return found


class FileNoteInput(WriteInput):
    words: str = Field(max_length=200)


class FileNoteOutput(StrictModel):
    filed: bool


def file_note(ctx):
    # A careless adopter's step: its progress and its error quote the personal argument.
    ctx.progress(1, 2, f"filing “{ctx.arguments.words}”")
    raise InvalidInput(f"cannot file “{ctx.arguments.words}”")


@pytest.fixture
def careless_long_tool(monkeypatch):
    """A long tool, for this test only, whose step quotes its personal argument in its progress and in the
    error it fails with (task.failure_reason, the step run's error, the task's webhook)."""
    monkeypatch.setattr(registry, "_TOOLS", dict(registry._TOOLS))
    return long_tool(name="file_note", title="File a note", description="File a note.", input_model=FileNoteInput,
                     output_model=FileNoteOutput, pipeline=Pipeline(steps=(Step("file", file_note),)),
                     personal_fields=frozenset({"words"}))


def start_task(caller, tool: str, arguments: dict, notify_url: str, key: str) -> Task:
    started = call_tool(get_tool("start_task"), caller, {"tool": tool, "arguments": arguments,
                                                        "notify_url": notify_url, "idempotency_key": key})
    assert started.error is None, started.error
    outcome = task_jobs.run_task(started.result["task_id"])
    task = Task.objects.get(pk=started.result["task_id"])
    assert task.finished, (outcome, task.status, task.failure_reason)
    return task


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
    own_link = f"{PUBLIC_URL}{reverse('admin:approval_decide', args=['x'])[:-2]}"  # alice's one-click link
    assert "Publish to staff: “[personal]” (24 characters)" in email["subject"] and own_link in email["body"]
    assert hook["data"]["summary"] == "Publish to staff: “[personal]” (24 characters)"
    assert hook["data"]["url"] == link
    assert CANARY not in json.dumps(delivered)


def test_after_retention_no_table_holds_a_personal_value_or_a_raw_key_and_the_chain_verifies(
        transactional_db, caller, alice, webhook, sink, gateway, careless_long_tool, fast):
    # given calls whose personal arguments and keys carry the canary, with every copy they make:
    # an approved announcement (its request, the approvers' messages), an order, a notification,
    # a payment (the gateway's answer kept as evidence), a long task that ingested a document, and one
    # whose step quoted the canary in its progress and its failure, each telling a webhook named with
    # the canary when it ended
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
    hooks = f"{sink.url}/webhooks/{CANARY}"
    ingested = start_task(caller, "ingest_document", {"text": f"# Minutes of {CANARY}\n\n{CANARY} chaired."},
                          f"{hooks}-ingested", f"task-{CANARY}")
    assert ingested.status == TaskStatus.SUCCEEDED, ingested.failure_reason
    failed = start_task(caller, "file_note", {"words": f"Dear {CANARY}"}, f"{hooks}-filed", f"note-task-{CANARY}")
    assert failed.status == TaskStatus.FAILED and CANARY in failed.failure_reason
    outbox.relay_batch()
    assert {f"{CANARY}-ingested", f"{CANARY}-filed"} <= {name for _, name, _ in sink.webhook_attempts()}
    # and an order scheduled for next week, and an event sent to waiting tasks, both carrying it
    scheduling.schedule(access.Agent(caller.tenant_id, "agent:test"), caller.tenant_id, "create_order", {
        "customer": CANARY, "currency": "EUR", "items": [{"sku": "BOLT-1", "quantity": 1, "unit_price": "2.50"}]},
        run_at=clock.read() + timedelta(days=7))
    assert send_event(caller.tenant_id, "customer.called", "c-1", {"customer": CANARY})

    # then the values the tools declared personal are stored encrypted wherever they are kept (core.personal:
    # records, approval requests, outbox payloads, tasks and their checkpoints, scheduled operations, task
    # events, evidence, audit details): those columns hold envelopes, never the canary
    held = columns_holding(CANARY)
    assert not held.keys() & ENCRYPTED, sorted(held.keys() & ENCRYPTED)
    assert ENCRYPTED_HERE <= columns_holding(f'"{personal.MARK}"').keys(), sorted(columns_holding(personal.MARK))
    # what still holds it in clear are the words around the values: the raw key, a webhook's address, what a
    # careless step wrote, the approval's summary (each emptied by the purge), and the effects themselves
    assert {"tools_app_idempotencyrecord.key", "tools_app_task.notify_url", "tools_app_task.failure_reason",
            "tools_app_steprun.error", "idemops_demo_documentchunk.text"} <= held.keys(), sorted(held)
    # and the engine, the relay and the steps read them whole
    assert CANARY in json.dumps(ApprovalRequest.objects.get(pk=request.pk).arguments)
    assert CANARY in json.dumps([event.payload for event in OutboxEvent.objects.all()])
    assert CANARY in json.dumps(Task.objects.get(pk=ingested.pk).arguments)

    # when the database's clock is past every retention (a year and more) and the purge runs
    long_ago = clock.read() - timedelta(days=400)
    IdempotencyRecord.objects.update(finished_at=long_ago, expires_at=long_ago)
    Task.objects.update(finished_at=long_ago)
    Document.objects.update(created_at=long_ago)
    retention.purge()

    # then no column of any table holds the canary but the business rows the calls made, and no raw key is left
    assert tables_holding(CANARY).keys() <= EFFECTS, columns_holding(CANARY)
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
