"""IdempotentClient against the real server (uvicorn, PostgreSQL), through the package's fault proxy.

The proxy really drops answers, cuts connections and answers 503; it also
counts the requests that reached it, so "not retried" and "no round trip"
are counted, not assumed. Orders are counted in the database.
"""

import asyncio
import json
import subprocess
import sys
from contextlib import asynccontextmanager, closing

import pytest

from idemops_client import IdempotentClient, Ledger, MemoryLedger, RetriesExhausted, RetryPolicy, State, ToolCallError
from idemops_client.faults import FaultProxy
from idemops_demo.models import Order
from tests.support.processes import ROOT
from tests.support.task_stack import wait_until

pytestmark = pytest.mark.live

ORDER = {"customer": "ACME", "currency": "EUR", "items": [{"sku": "BOLT-1", "quantity": 3, "unit_price": "2.50"}]}
QUICK = RetryPolicy(max_attempts=6, max_seconds=60, base_delay=0.05, max_delay=0.5, attempt_timeout=10)


@asynccontextmanager
async def agent(web, token, *, ledger=None, session="chat-42", policy=QUICK):
    async with FaultProxy(web.base_url) as proxy:
        async with IdempotentClient(proxy.url_for(web.mcp_url), token, ledger=ledger or MemoryLedger(),
                                    session_id=session, policy=policy) as client:
            yield proxy, client


def test_an_answer_lost_after_the_server_acted_is_asked_again_with_the_same_key_and_replayed(web_server, token):
    async def scenario():
        async with agent(web_server, token) as (proxy, client):
            proxy.inject("drop_response", "create_order")
            return await client.call("create_order", ORDER), proxy.calls("create_order"), client.ledger.entries()

    result, requests, entries = asyncio.run(scenario())

    order = Order.objects.get()
    assert result["order_id"] == order.pk and result.replayed and result.attempts == 2
    assert [r.fault for r in requests] == ["drop_response", None]
    assert len({r.key for r in requests}) == 1 and requests[0].structured["order_id"] == order.pk
    assert [(e.state, e.result["order_id"]) for e in entries] == [(State.DONE, order.pk)]


def test_a_connection_cut_in_the_middle_of_a_write_makes_one_order(web_server, token):
    async def scenario():
        async with agent(web_server, token) as (proxy, client):
            proxy.inject("disconnect", "create_order", seconds=0)
            result = await client.call("create_order", ORDER)
            await proxy.settle()
            return result, proxy.calls("create_order")

    result, requests = asyncio.run(scenario())

    assert Order.objects.count() == 1 and result["order_id"] == Order.objects.get().pk
    assert [r.fault for r in requests] == ["disconnect", None]
    # The server did act on the request whose connection was cut.
    assert not requests[0].delivered and requests[0].structured["order_id"] == result["order_id"]
    assert requests[0].key == requests[1].key


def test_a_503_with_retry_after_is_waited_out_then_asked_again_with_the_same_key(web_server, token):
    async def scenario():
        async with agent(web_server, token) as (proxy, client):
            proxy.inject("unavailable", "create_order", retry_after=1)
            return await client.call("create_order", ORDER), proxy.calls("create_order")

    result, requests = asyncio.run(scenario())

    assert [r.status for r in requests] == [503, 200] and requests[0].key == requests[1].key
    assert requests[1].at - requests[0].at >= 1.0
    assert not result.replayed and Order.objects.count() == 1


def test_a_transient_answer_from_the_server_is_retried_with_the_same_key(web_server, token, gateway):
    gateway.set_fault("*", "unavailable", times=1)

    async def scenario():
        async with agent(web_server, token) as (proxy, client):
            result = await client.call("request_payment", {"amount": "12.34", "currency": "EUR", "payee": "Bolt Ltd"})
            return result, proxy.calls("request_payment")

    result, requests = asyncio.run(scenario())

    assert requests[0].structured["error"]["class"] == "transient" and len({r.key for r in requests}) == 1
    assert len(requests) == 2
    assert [row[0] for row in gateway.payments()] == [result["payment_id"]]


def test_a_replanned_identical_call_is_answered_from_the_ledger_without_a_request(web_server, token):
    async def scenario():
        async with agent(web_server, token) as (proxy, client):
            first = await client.call("create_order", ORDER)
            replanned = {"items": [{"unit_price": "2.50", "quantity": 3.0, "sku": "BOLT-1"}], "currency": "EUR",
                         "customer": "ACME", "trace_id": "model-turn-7"}
            again = await client.call("create_order", replanned)
            return first, again, proxy.calls("create_order")

    first, again, requests = asyncio.run(scenario())

    assert len(requests) == 1
    assert again.from_ledger and again.replayed and again["order_id"] == first["order_id"]
    assert again.key == first.key and Order.objects.count() == 1


def test_identical_calls_at_once_in_one_process_send_one_request_and_make_one_order(web_server, token):
    async def scenario():
        async with agent(web_server, token) as (proxy, client):
            results = await asyncio.gather(*(client.call("create_order", ORDER) for _ in range(10)))
            return results, proxy.calls("create_order")

    results, requests = asyncio.run(scenario())

    assert len(requests) == 1 and Order.objects.count() == 1
    assert {r["order_id"] for r in results} == {Order.objects.get().pk}
    assert sum(r.from_ledger for r in results) == 9


def test_an_explicit_key_wins_over_the_derived_one(web_server, token):
    async def scenario():
        async with agent(web_server, token) as (proxy, client):
            await client.call("create_order", ORDER, key="order-2026-0001")
            await client.call("create_order", {**ORDER, "idempotency_key": "order-2026-0002"})
            return [r.key for r in proxy.calls("create_order")]

    assert asyncio.run(scenario()) == ["order-2026-0001", "order-2026-0002"]
    assert Order.objects.count() == 2


@pytest.mark.parametrize(("case", "expected"), [
    ("invalid_input", "invalid_input"), ("conflict", "conflict"), ("not_found", "not_found"),
    ("bad_token", "unauthorized"),
])
def test_deterministic_errors_are_sent_once_and_never_retried(web_server, token, case, expected):
    async def scenario():
        async with agent(web_server, "idm_not-a-token" if case == "bad_token" else token) as (proxy, client):
            if case == "conflict":
                await client.call("create_order", ORDER, key="k-conflict")
            elif case != "bad_token":
                await client.tools()  # the connection is open: one call is one request from here
            before = sum(proxy.counts().values())
            with pytest.raises(ToolCallError) as raised:
                if case == "invalid_input":
                    await client.call("create_order", {**ORDER, "currency": "euro"})
                elif case == "conflict":
                    await client.call("create_order", {**ORDER, "customer": "Globex"}, key="k-conflict")
                elif case == "not_found":
                    await client.call("get_order", {"order_id": 999_999})
                else:
                    await client.call("create_order", ORDER)
            return raised.value, sum(proxy.counts().values()) - before, client.ledger.entries()

    error, requests, entries = asyncio.run(scenario())

    assert error.error_class == expected and not isinstance(error, RetriesExhausted)
    assert requests == 1
    if case == "conflict":
        # The first operation's entry stays as it was.
        assert Order.objects.count() == 1
        assert [(e.state, e.result["order_id"]) for e in entries] == [(State.DONE, Order.objects.get().pk)]
    else:
        assert Order.objects.count() == 0


def test_the_attempt_budget_ends_with_an_exception_naming_the_last_class(web_server, token):
    async def scenario():
        policy = RetryPolicy(max_attempts=4, max_seconds=60, base_delay=0.01, max_delay=0.05)
        async with agent(web_server, token, policy=policy) as (proxy, client):
            proxy.inject("unavailable", "create_order", times=100, retry_after=0.1)
            with pytest.raises(RetriesExhausted) as raised:
                await client.call("create_order", ORDER)
            return raised.value, proxy.calls("create_order"), client.ledger.entries(), client.ledger.summary_for_model()

    error, requests, entries, summary = asyncio.run(scenario())

    assert (error.reason, error.error_class, error.attempts) == ("attempts", "unavailable", 4)
    assert "→ submitted, no result yet (last answer: unavailable)" in summary
    assert "retry budget exhausted" in str(error) and "unavailable" in str(error)
    assert len(requests) == 4 and len({r.key for r in requests}) == 1
    # Every 503 refused the request: nothing happened, and the ledger says so.
    assert Order.objects.count() == 0 and entries[0].state == State.SUBMITTED


def test_the_time_budget_stops_before_a_wait_that_would_overrun_it(web_server, token):
    async def scenario():
        policy = RetryPolicy(max_attempts=100, max_seconds=3, base_delay=0.01, max_delay=0.05)
        async with agent(web_server, token, policy=policy) as (proxy, client):
            proxy.inject("unavailable", "create_order", times=100, retry_after=2)
            with pytest.raises(RetriesExhausted) as raised:
                await client.call("create_order", ORDER)
            return raised.value, proxy.calls("create_order")

    error, requests = asyncio.run(scenario())

    assert (error.reason, error.error_class, error.retry_after) == ("time", "unavailable", 2.0)
    assert len(requests) == 2


def test_answers_lost_every_time_leave_an_unknown_entry_and_one_order_that_a_later_call_finds(web_server, token):
    async def scenario():
        policy = RetryPolicy(max_attempts=3, max_seconds=60, base_delay=0.01, max_delay=0.05)
        ledger = MemoryLedger()
        async with agent(web_server, token, ledger=ledger, policy=policy) as (proxy, client):
            proxy.inject("drop_response", "create_order", times=3)
            with pytest.raises(RetriesExhausted) as raised:
                await client.call("create_order", ORDER)
            state = client.ledger.entries()[0].state
            later = await client.call("create_order", ORDER)
            return raised.value, state, later, proxy.calls("create_order")

    error, state, later, requests = asyncio.run(scenario())

    assert error.error_class == "transport" and state == State.UNKNOWN
    assert later.replayed and not later.from_ledger and later["order_id"] == Order.objects.get().pk
    assert len(requests) == 4 and len({r.key for r in requests}) == 1


def run_agent(web, token, ledger, customer, *extra) -> dict:
    completed = subprocess.run([sys.executable, "-m", "tests.client.agent_process", web.mcp_url, token, str(ledger),
                                "chat-42", customer, *extra], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr
    return json.loads(completed.stdout.strip().splitlines()[-1])


def test_a_second_client_process_answers_a_done_call_from_the_ledger_the_first_one_wrote(web_server, token,
                                                                                          tmp_path):
    ledger = tmp_path / "calls.sqlite"

    first = run_agent(web_server, token, ledger, "ACME")
    second = run_agent(web_server, token, ledger, "ACME")

    assert first["requests"] == 1 and not first["from_ledger"]
    assert second == {**first, "from_ledger": True, "replayed": True, "requests": 0}
    assert Order.objects.count() == 1


def test_a_call_whose_answers_were_lost_is_asked_again_with_the_same_key_after_a_restart(web_server, token,
                                                                                         tmp_path):
    ledger = tmp_path / "calls.sqlite"

    first = run_agent(web_server, token, ledger, "ACME", "--drop", "2", "--attempts", "2")
    second = run_agent(web_server, token, ledger, "ACME")

    assert first["error_class"] == "transport" and first["requests"] == 2
    assert second["key"] == first["key"] and second["replayed"] and second["requests"] == 1
    assert second["order_id"] == Order.objects.get().pk


def test_a_client_killed_while_waiting_for_an_answer_leaves_an_entry_the_next_process_asks_about(web_server, token,
                                                                                                tmp_path):
    ledger = tmp_path / "calls.sqlite"
    # Every answer is lost, so the first process keeps asking until it is killed.
    agent_process = subprocess.Popen([sys.executable, "-m", "tests.client.agent_process", web_server.mcp_url, token,
                                      str(ledger), "chat-42", "ACME", "--drop", "1000", "--attempts", "1000"],
                                     cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: Order.objects.exists(), timeout=60, what="the first process's order")
    finally:
        agent_process.kill()
        agent_process.wait()
    with closing(Ledger(ledger)) as reopened:
        left = reopened.entries("chat-42")[0]

    second = run_agent(web_server, token, ledger, "ACME")

    assert left.state in (State.SUBMITTED, State.UNKNOWN)
    assert second["key"] == left.key and second["replayed"] and second["requests"] == 1
    assert Order.objects.count() == 1 and second["order_id"] == Order.objects.get().pk


def test_read_tools_are_not_recorded_and_are_retried_after_a_lost_answer(web_server, token):
    async def scenario():
        async with agent(web_server, token) as (proxy, client):
            order = await client.call("create_order", ORDER)
            proxy.inject("drop_response", "get_order")
            found = await client.call("get_order", {"order_id": order["order_id"]})
            return found, proxy.calls("get_order"), client.ledger.entries()

    found, requests, entries = asyncio.run(scenario())

    assert found["customer"] == "ACME" and len(requests) == 2
    assert [e.tool for e in entries] == ["create_order"]


def test_the_summary_for_the_model_reads_the_operations_of_the_session(web_server, token):
    async def scenario():
        async with agent(web_server, token) as (_, client):
            order = await client.call("create_order", ORDER)
            with pytest.raises(ToolCallError):
                await client.call("create_order", {**ORDER, "currency": "euro"})
            return order, client.ledger.summary_for_model()

    order, summary = asyncio.run(scenario())

    lines = summary.splitlines()
    assert lines[1] == (f"- create_order(customer=ACME, currency=EUR, 1 item) → done, order {order['order_id']} "
                        f"(key {order.key[:11]}…)")
    assert lines[2].startswith("- create_order(customer=ACME, currency=euro, 1 item) → failed: invalid_input")
    assert token not in summary and order.key not in summary


def test_a_timed_out_attempt_is_asked_again_and_the_late_original_is_a_replay(web_server, token):
    async def scenario():
        policy = RetryPolicy(max_attempts=6, max_seconds=60, base_delay=0.05, max_delay=0.2, attempt_timeout=1)
        async with agent(web_server, token, policy=policy) as (proxy, client):
            proxy.inject("delay", "create_order", seconds=2.5)
            result = await client.call("create_order", ORDER)
            await proxy.settle()
            return result, proxy.calls("create_order")

    result, requests = asyncio.run(scenario())

    assert Order.objects.count() == 1 and result["order_id"] == Order.objects.get().pk
    late = next(r for r in requests if r.fault == "delay")
    assert late.structured["order_id"] == result["order_id"] and late.structured["idempotency"]["replayed"]
