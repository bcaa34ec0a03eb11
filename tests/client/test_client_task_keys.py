"""The client's ledger keeps an operation whose task is unfinished, whatever its TTL (issue 27, item 1).

IdempotentClient against the real server (uvicorn, PostgreSQL; no worker, so a started task stays
queued), through the package's fault proxy, which counts the requests that reached the server.
"""

import asyncio
from contextlib import asynccontextmanager

import pytest

from idemops_client import IdempotentClient, MemoryLedger, RetryPolicy
from idemops_client.faults import FaultProxy
from tests.support.tasks_support import TEXT
from tools_app import tasks
from tools_app.access import Agent
from tools_app.models import Task

pytestmark = pytest.mark.live

QUICK = RetryPolicy(max_attempts=5, max_seconds=30, base_delay=0.01, max_delay=0.05, attempt_timeout=10)
START = {"tool": "ingest_document", "arguments": {"text": TEXT}}


@asynccontextmanager
async def agent(web, token, ledger):
    async with FaultProxy(web.base_url) as proxy:
        async with IdempotentClient(proxy.url_for(web.mcp_url), token, ledger=ledger, session_id="chat-42",
                                    policy=QUICK) as client:
            yield proxy, client


def test_the_ledger_keeps_a_started_task_until_the_server_says_it_ended_then_its_ttl_counts(web_server, token):
    # given a ledger whose TTL has always already run out (an entry is forgotten as soon as it is written)
    ledger = MemoryLedger(ttl=0)

    async def start_twice():
        async with agent(web_server, token, ledger) as (proxy, client):
            first = await client.call("start_task", START, key="t-1")
            again = await client.call("start_task", START, key="t-1")
            return first, again, [call.tool for call in proxy.calls()]

    # when the agent starts a task, and asks again with the same key
    first, again, sent = asyncio.run(start_twice())

    # then the ledger kept the call while its task is unfinished, and answered the second call itself
    assert first["task_id"] == again["task_id"] == str(Task.objects.get().pk)
    assert sent == ["start_task"] and again.from_ledger
    assert first.structured["idempotency"]["expires_at"] is None
    [entry] = ledger.entries("chat-42")
    assert entry.held

    # and once the task ended, a refresh hears so: the entry's TTL counts from then (here: gone at once)
    task = Task.objects.get()
    tasks.cancel(task, Agent(task.tenant_id, task.actor), reason="not needed")

    async def refresh():
        async with agent(web_server, token, ledger) as (_, client):
            return await client.refresh()

    [refreshed] = asyncio.run(refresh())
    assert not refreshed.held
    assert ledger.entries("chat-42") == []
