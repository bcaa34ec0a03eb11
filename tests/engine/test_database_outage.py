"""PostgreSQL restarting under load: every answer carries a class, and every key then succeeds once.

The test runs a whole stack of its own against a PostgreSQL server of its
own (so stopping it disturbs no other test): web (uvicorn), a django-q2
cluster, the payment gateway and the notification sink, all on that server.
Twenty agents call create_order and request_payment (prepared first: its key is an
operation id the server issues) over raw HTTP, honouring Retry-After, while the
server is stopped for a few seconds and started again.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import httpx2
import pytest
from mcp.shared.exceptions import MCPError

from idemops_demo.models import Order
from tests.support.agents import Answer, call_tool, call_tool_sync, call_until_done, issued_operation_id
from tests.support.mcp_client import call
from tests.support.processes import Stack, manage
from tools_app.models import IdempotencyRecord

pytestmark = pytest.mark.live

CLIENTS = 20
OUTAGE_SECONDS = 3
LEASE_SECONDS = 3
GATEWAY_TIMEOUT_SECONDS = 10
ORDER = {"customer": "ACME", "items": [{"sku": "BOLT-1", "quantity": 2, "unit_price": "2.50"}], "currency": "EUR"}
PAYMENT = {"amount": "10.00", "currency": "EUR", "payee": "Bob", "reference": "outage"}


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    # The gateway's timeout outlasts stopping the database (a process of its own, slow on a busy machine): a
    # call whose gateway request hangs is still inside the engine when the database goes, whatever the load.
    stack = Stack(tmp_path_factory.mktemp("outage"), "outage", IDEMOPS_EXECUTION_LEASE_SECONDS=str(LEASE_SECONDS),
                  IDEMOPS_LEASE_SWEEP_SECONDS="0.5",
                  IDEMOPS_PAYMENT_GATEWAY_TIMEOUT_SECONDS=str(GATEWAY_TIMEOUT_SECONDS))
    yield stack
    stack.stop()


@dataclass
class Agent:
    number: int
    answers: list[Answer] = field(default_factory=list)
    orders: dict[str, int] = field(default_factory=dict)  # key -> order_id answered
    payments: dict[str, str] = field(default_factory=dict)  # key (the issued operation id) -> payment_id answered

    async def work(self, stack: Stack, stop: asyncio.Event, deadline: float) -> None:
        async with httpx2.AsyncClient(timeout=30) as client:
            round_ = 0
            while not stop.is_set():
                key = f"a{self.number}-r{round_}"
                order = await call_until_done(client, stack.web.mcp_url, stack.token, "create_order",
                                              {**ORDER, "idempotency_key": f"{key}-order"}, self.answers, deadline)
                self.orders[f"{key}-order"] = order.result["order_id"]
                operation_id = await issued_operation_id(client, stack.web.mcp_url, stack.token, "request_payment",
                                                         PAYMENT, f"{key}-prepare", self.answers, deadline)
                payment = await call_until_done(client, stack.web.mcp_url, stack.token, "request_payment",
                                                {**PAYMENT, "idempotency_key": operation_id}, self.answers, deadline)
                self.payments[operation_id] = payment.result["payment_id"]
                round_ += 1


async def restart_under_load(stack: Stack, agents: list[Agent]) -> None:
    stop = asyncio.Event()
    deadline = time.monotonic() + 120
    work = [asyncio.create_task(agent.work(stack, stop, deadline)) for agent in agents]
    await asyncio.sleep(1.5)
    await asyncio.to_thread(stack.database.stop)
    await asyncio.sleep(OUTAGE_SECONDS)
    await asyncio.to_thread(stack.database.start)
    await asyncio.sleep(2)
    stop.set()
    await asyncio.gather(*work)


def test_every_answer_during_a_database_restart_has_a_class_and_every_key_then_succeeds_once(stack):
    # given twenty agents each creating orders and payments, one key after the other
    agents = [Agent(n) for n in range(CLIENTS)]

    # when PostgreSQL stops for a few seconds and starts again under them
    asyncio.run(restart_under_load(stack, agents))

    # then every answer told the agent what to do: a result, a 503 with Retry-After and a
    # JSON-RPC error of class transient, or a tool error with its class
    answers = [answer for agent in agents for answer in agent.answers]
    problems = [problem for answer in answers if (problem := answer.problem())]
    assert problems == []
    # (the outage was seen, both at the door and inside tool calls)
    assert any(a.status == 503 and a.error_class == "transient" for a in answers)
    assert any(a.status == 200 and a.error_class == "transient" for a in answers)

    # and every key succeeded exactly once: one order per create_order key, one payment per request_payment key
    orders = {key: id_ for agent in agents for key, id_ in agent.orders.items()}
    payments = {key: id_ for agent in agents for key, id_ in agent.payments.items()}
    assert len(orders) >= CLIENTS and len(payments) >= CLIENTS
    order_rows = stack.sql(
        f'SELECT r.key, o.id FROM "{Order._meta.db_table}" o '
        f'JOIN "{IdempotencyRecord._meta.db_table}" r ON r.id = o.record_id')
    assert sorted(order_rows) == sorted(orders.items())
    forwarded = stack.forwarded_keys(payments)
    payment_rows = stack.gateway.sql("SELECT idempotency_key, id FROM payments")
    assert sorted(payment_rows) == sorted((forwarded[key], id_) for key, id_ in payments.items())


async def call_with_the_sdk(stack: Stack, token: str) -> MCPError:
    """The error the SDK's client raises (from inside its task groups) for a call while the database is down."""
    with pytest.raises(BaseExceptionGroup) as raised:
        await call(stack.web.mcp_url, token, "create_order", {**ORDER, "idempotency_key": "sdk-down"})
    error = raised.value
    while isinstance(error, BaseExceptionGroup):
        (error,) = error.exceptions
    assert isinstance(error, MCPError)
    return error


def test_while_the_database_is_down_every_entry_point_answers_503_and_all_recover_by_themselves(stack):
    # given a payment whose gateway call hangs, so the call is inside the engine when the database goes
    prepared = call_tool_sync(stack.web.mcp_url, stack.token, "prepare_operation",
                              {"tool": "request_payment", "arguments": PAYMENT, "idempotency_key": "down-prepare"})
    key = prepared.result["operation_id"]
    # A token the web process has not verified yet (a verified one is trusted for IDEMOPS_TOKEN_CACHE_SECONDS
    # without the database): checking it needs the database.
    unchecked = manage("issue_token", "acme", "newcomer", "--owner", "owner", env=stack.env).stdout.splitlines()[-1]
    stack.gateway.set_fault("*", "hang", times=1)  # the next payment request, this one
    arguments = {**PAYMENT, "idempotency_key": key}

    async def pay_while_the_database_stops() -> Answer:
        async with httpx2.AsyncClient(timeout=30) as client:
            pending = asyncio.create_task(call_tool(client, stack.web.mcp_url, stack.token, "request_payment",
                                                    arguments))
            while not stack.sql("SELECT 1 FROM tools_app_idempotencyrecord WHERE key = %s", [key]):
                await asyncio.sleep(0.05)
            await asyncio.to_thread(stack.database.stop)
            return await pending

    inside = asyncio.run(pay_while_the_database_stops())
    try:
        # then the call that reached the engine is a transient error with retry_after
        assert inside.status == 200 and inside.is_error
        assert inside.error["class"] == "transient" and inside.error["retry_after"] > 0

        # and /mcp answers a token it cannot check 503 + Retry-After with a JSON-RPC error, which the
        # SDK's client raises
        raw = httpx2.post(stack.web.mcp_url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                          headers={"Authorization": f"Bearer {unchecked}",
                                   "Accept": "application/json, text/event-stream"}, timeout=10)
        assert raw.status_code == 503 and int(raw.headers["retry-after"]) >= 1
        assert raw.headers["content-type"] == "application/json"
        assert raw.json()["error"]["data"]["class"] == "transient"
        sdk_error = asyncio.run(call_with_the_sdk(stack, unchecked))
        assert sdk_error.data["class"] == "transient" and sdk_error.data["retry_after"] > 0

        # and the admin, the API and every /healthz answer 503
        admin = httpx2.get(f"{stack.web.base_url}/admin/", cookies={"sessionid": "x" * 32}, timeout=10)
        assert admin.status_code == 503 and admin.headers["content-type"].startswith("text/html")
        assert "retry-after" in admin.headers and "unavailable" in admin.text
        api = httpx2.get(f"{stack.web.base_url}/api/v1/idempotency-records",
                         headers={"Authorization": "Bearer ida_unknown"}, timeout=10)
        assert api.status_code == 503 and "retry-after" in api.headers
        assert api.json()["error"]["class"] == "transient"
        health = httpx2.get(f"{stack.web.base_url}/healthz", timeout=10)
        assert health.status_code == 503 and "retry-after" in health.headers
        assert health.json()["checks"]["database"]["ok"] is False
        for service in (stack.gateway, stack.sink):
            assert httpx2.get(f"{service.url}/healthz", timeout=10).status_code == 503
    finally:
        stack.database.start()

    # when the database is back, everything answers again without a restart of any process
    assert httpx2.get(f"{stack.web.base_url}/healthz", timeout=10).status_code == 200
    for service in (stack.gateway, stack.sink):
        assert httpx2.get(f"{service.url}/healthz", timeout=10).status_code == 200
    assert httpx2.get(f"{stack.web.base_url}/admin/", cookies={"sessionid": "x" * 32}, timeout=10,
                      follow_redirects=False).status_code == 302  # to the login page

    # and the interrupted payment settles through the cluster's reconciliation: paid exactly once
    async def retry_until_paid() -> tuple[Answer, list[Answer]]:
        answers: list[Answer] = []
        async with httpx2.AsyncClient(timeout=30) as client:
            paid = await call_until_done(client, stack.web.mcp_url, stack.token, "request_payment", arguments,
                                         answers, deadline=time.monotonic() + 60)
        return paid, answers

    answer, answers = asyncio.run(retry_until_paid())
    assert [a.problem() for a in answers if a.problem()] == []
    assert stack.gateway.sql("SELECT id FROM payments WHERE idempotency_key = %s",
                             [stack.forwarded_keys([key])[key]]) == [
        (answer.result["payment_id"],)]

    # and the cluster delivers notifications again (its pusher, workers and the sink reconnected)
    sent = call_tool_sync(stack.web.mcp_url, stack.token, "send_notification", {
        "channel": "webhook", "recipient": f"{stack.sink.url}/webhooks/ops", "subject": "back",
        "body": "the database is back", "idempotency_key": "back-1"})
    assert sent.succeeded, sent.body
    deadline = time.monotonic() + 30
    while not stack.sink.messages() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert list(stack.sink.messages().values()) == [1]
