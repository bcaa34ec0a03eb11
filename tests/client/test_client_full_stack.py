"""The client and its demo against the whole platform: web, job workers, payment gateway, notification sink."""

import asyncio
import subprocess
import sys

import pytest

from idemops_client import IdempotentClient, Ledger, MemoryLedger, RetriesExhausted, RetryPolicy, State
from idemops_client.faults import FaultProxy
from idemops_demo.models import Announcement, Document
from tests.support.operators import make_operator
from tests.support.processes import ROOT
from tools_app import approvals
from tools_app.access.roles import APPROVER
from tools_app.models import ApprovalRequest, IdempotencyRecord, RecordStatus, Task, Tenant

pytestmark = [pytest.mark.live, pytest.mark.usefixtures("settle_tasks")]


def test_the_demo_ends_with_duplicates_0_and_exits_0(full_stack, token):
    demo = subprocess.run([sys.executable, "-m", "idemops_client.demo", "--url", full_stack.mcp_url,
                           "--token", token], cwd=ROOT, capture_output=True, text=True, timeout=600)

    lines = demo.stdout.strip().splitlines()
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert lines[-1].startswith("demo: ") and lines[-1].endswith("duplicates 0")
    assert "1 answered from the ledger" in lines[-1] and "1 deterministic error not retried" in lines[-1]
    assert "1 high-risk call under a server-issued operation id" in lines[-1]
    assert any(line.startswith("- get_operation: payment operation succeeded") for line in lines)
    assert token not in demo.stdout


def test_a_long_call_cut_while_the_server_waits_for_its_task_is_rejoined(full_stack, token):
    async def scenario():
        async with FaultProxy(full_stack.base_url) as proxy:
            policy = RetryPolicy(max_attempts=30, max_seconds=120, base_delay=0.1, max_delay=1, attempt_timeout=30)
            async with IdempotentClient(proxy.url_for(full_stack.mcp_url), token, ledger=MemoryLedger(),
                                        session_id="chat-42", policy=policy) as client:
                proxy.inject("disconnect", "ingest_document", seconds=0.3)
                result = await client.call("ingest_document", {"text": "One document, however often it is asked. "
                                                                        * 50, "filename": "once.md"})
                await proxy.settle()
                return result, proxy.calls("ingest_document")

    result, requests = asyncio.run(scenario())

    assert requests[0].fault == "disconnect" and len({r.key for r in requests}) == 1
    assert Task.objects.count() == 1 and Document.objects.count() == 1
    assert result["document_id"] == Document.objects.get().pk


def test_a_payment_whose_gateway_answer_never_came_is_asked_about_until_reconciled(full_stack, token, gateway):
    gateway.set_fault("*", "succeed-then-hang", times=1)

    async def scenario():
        async with FaultProxy(full_stack.base_url) as proxy:
            policy = RetryPolicy(max_attempts=100, max_seconds=120, base_delay=0.2, max_delay=2, attempt_timeout=30)
            async with IdempotentClient(proxy.url_for(full_stack.mcp_url), token, ledger=MemoryLedger(),
                                        session_id="chat-42", policy=policy) as client:
                result = await client.call("request_payment", {"amount": "99.00", "currency": "EUR",
                                                               "payee": "Bolt Ltd"})
                return result, proxy.calls("request_payment")

    result, requests = asyncio.run(scenario())

    assert requests[0].structured["error"]["class"] == "unknown_outcome"
    assert len({r.key for r in requests}) == 1
    assert [row[0] for row in gateway.payments()] == [result["payment_id"]]
    assert IdempotencyRecord.objects.get(tool="request_payment").status == RecordStatus.SUCCEEDED


def test_a_call_waiting_for_approval_stays_pending_in_the_ledger_and_a_later_call_gets_the_result(
        full_stack, token, tmp_path):
    note = {"title": "Maintenance", "body": "Down at 2am", "audience": "staff"}

    async def agent_turn(policy):
        async with FaultProxy(full_stack.base_url) as proxy:
            async with IdempotentClient(proxy.url_for(full_stack.mcp_url), token, ledger=Ledger(tmp_path / "l.sqlite"),
                                        session_id="chat-42") as client:
                try:
                    outcome = await client.call("publish_announcement", note, policy=policy)
                except RetriesExhausted as error:
                    outcome = error
                return (outcome, client.ledger.entries()[0], client.ledger.summary_for_model(),
                        proxy.calls("publish_announcement"))

    # The server says to come back in 30 s: past a 5 s budget, so the client stops at once.
    error, waiting, summary, first_requests = asyncio.run(agent_turn(RetryPolicy(max_attempts=10, max_seconds=5)))
    bob = make_operator("bob", APPROVER, Tenant.objects.get(slug="acme"))
    approvals.approve(ApprovalRequest.objects.get(), bob)
    result, done, _, later_requests = asyncio.run(agent_turn(RetryPolicy(max_attempts=30, max_seconds=90,
                                                                         max_delay=2)))

    assert (error.error_class, error.reason, error.attempts) == ("pending_approval", "time", 1)
    assert waiting.state == State.PENDING_APPROVAL and "→ pending approval by a person" in summary
    assert result["announcement_id"] == Announcement.objects.get().pk and done.state == State.DONE
    assert {r.key for r in first_requests + later_requests} == {waiting.key}
    assert str(Announcement.objects.get().record.operation_id) == waiting.key  # the id the server issued
