"""A call that waits holds none of its web process's database threads.

One web process with four database threads (IDEMOPS_MCP_DB_THREADS), no job cluster (so tasks
never run) and a payment gateway that holds a payment until the test lets it go. A hundred
calls wait at once: retries of that payment following its executor, get_task_status and
get_task_result with wait_seconds, and direct calls of a long tool waiting for their task.
While every one of them still waits, `whoami` is answered. Were a wait to hold a thread, the
first four would hold them all, and nothing else (not even the others' token checks) would run
until a wait ran out.
"""

from __future__ import annotations

import asyncio

import pytest

from tests.support.issued_ids import labelled_arguments
from tests.support.mcp_client import connect
from tests.support.processes import WebServer

pytestmark = pytest.mark.live

PAYMENT = {"amount": "10.00", "currency": "EUR", "payee": "ACME", "idempotency_key": "pay-held"}
DOCUMENT = {"text": "# Waiting\n\nA document nobody processes while the test runs."}
WAIT = 600  # longer than the test: every wait here ends because what it waits for happened


@pytest.fixture
def web(gateway, transactional_db):
    server = WebServer("web-waits", IDEMOPS_MCP_DB_THREADS="4", IDEMOPS_PAYMENT_GATEWAY_URL=gateway.url,
                       IDEMOPS_PAYMENT_GATEWAY_TIMEOUT_SECONDS=str(WAIT), IDEMOPS_FOLLOWER_WAIT_SECONDS=str(WAIT),
                       IDEMOPS_TASK_MAX_WAIT_SECONDS=str(WAIT), IDEMOPS_TASK_CALL_WAIT_SECONDS=str(WAIT))
    yield server
    server.stop()


def test_a_hundred_waiting_calls_leave_the_process_free_to_answer_whoami(web, gateway, token):
    gateway.set_fault("*", "slow", times=1, seconds=WAIT)
    # request_payment takes an operation id issued by prepare_operation (tests/support/issued_ids.py)
    payment = labelled_arguments(web.mcp_url, token, "request_payment", PAYMENT)

    async def scenario():
        reported: set[int] = set()
        all_reported = asyncio.Event()

        async def call(tool: str, arguments: dict, index: int | None = None):
            async def progress(done, total, message):
                reported.add(index)
                if len(reported) == 70:
                    all_reported.set()

            async with connect(web.mcp_url, token) as client:
                return await client.call_tool(tool, arguments,
                                              progress_callback=progress if index is not None else None)

        async def one(tool: str, arguments: dict):
            async with connect(web.mcp_url, token) as client:
                return await client.call_tool(tool, arguments)

        task_id = (await one("start_task", {"tool": "ingest_document", "arguments": DOCUMENT,
                                            "idempotency_key": "task-waited-on"})).structured_content["task_id"]

        # given the payment's executor held inside its gateway call, and 30 retries following it
        executor = asyncio.create_task(call("request_payment", payment))
        while not gateway.sql("SELECT 1 FROM faults WHERE remaining = 0"):  # the gateway holds it now
            await asyncio.sleep(0.1)
        followers = [asyncio.create_task(call("request_payment", payment)) for _ in range(30)]
        # and 70 calls waiting for tasks that do not run (each reports progress once it waits)
        waiting = {"task_id": task_id, "wait_seconds": WAIT}
        task_waiters = (
            [asyncio.create_task(call("get_task_status", waiting, i)) for i in range(30)]
            + [asyncio.create_task(call("get_task_result", waiting, i)) for i in range(30, 50)]
            + [asyncio.create_task(call("ingest_document", {**DOCUMENT, "idempotency_key": "doc-direct"}, i))
               for i in range(50, 70)])
        await asyncio.wait_for(all_reported.wait(), timeout=300)

        # when another call arrives
        whoami = await one("whoami", {})

        # then it is answered while all hundred still wait
        still_waiting = [t for t in [executor, *followers, *task_waiters] if not t.done()]
        assert not whoami.is_error and whoami.structured_content["agent"] == "agent:acme/agent"
        assert len(still_waiting) == 101

        # and each waiter gets its real answer once what it waits for happens
        gateway.clear_fault("*")
        await one("cancel_task", {"task_id": task_id, "idempotency_key": "cancel-1"})
        direct = await one("start_task", {"tool": "ingest_document", "arguments": DOCUMENT,
                                          "idempotency_key": "doc-direct"})
        await one("cancel_task", {"task_id": direct.structured_content["task_id"], "idempotency_key": "cancel-2"})
        return await executor, await asyncio.gather(*followers), await asyncio.gather(*task_waiters)

    paid, followers, task_waiters = asyncio.run(scenario())

    assert not paid.is_error, paid.structured_content
    assert [f.structured_content.get("payment_id") for f in followers] == [paid.structured_content["payment_id"]] * 30
    assert all(f.structured_content["idempotency"]["replayed"] for f in followers)
    assert [w.structured_content.get("status") for w in task_waiters[:30]] == ["cancelled"] * 30
    assert {w.structured_content["error"]["class"] for w in task_waiters[30:]} == {"already_done"}
    assert len(gateway.payments()) == 1
