"""The client and its demo against the whole platform: web, job workers, payment gateway, notification sink."""

import asyncio
import subprocess
import sys

import pytest

from idemops_client import IdempotentClient, MemoryLedger, RetryPolicy
from idemops_client.faults import FaultProxy
from tests.processes import ROOT
from tools_app.models import Document, IdempotencyRecord, RecordStatus, Task

pytestmark = [pytest.mark.live, pytest.mark.usefixtures("settle_tasks")]


def test_the_demo_ends_with_duplicates_0_and_exits_0(full_stack, token):
    demo = subprocess.run([sys.executable, "-m", "idemops_client.demo", "--url", full_stack.mcp_url,
                           "--token", token], cwd=ROOT, capture_output=True, text=True, timeout=600)

    lines = demo.stdout.strip().splitlines()
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert lines[-1].startswith("demo: ") and lines[-1].endswith("duplicates 0")
    assert "1 answered from the ledger" in lines[-1] and "1 deterministic error not retried" in lines[-1]
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
