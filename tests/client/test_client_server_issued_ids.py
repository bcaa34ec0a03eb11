"""Server-issued operation ids, get_operation and declared non-business fields, from the client's side.

IdempotentClient against the real server (uvicorn, PostgreSQL, the payment gateway process), through
the package's fault proxy, which counts the requests that reached the server. request_payment is a
high-risk tool: the client asks prepare_operation for its key by itself and carries the id verbatim.
"""

import asyncio
from contextlib import asynccontextmanager
from datetime import timedelta

import pytest
from django.utils import timezone

from idemops_client import IdempotentClient, MemoryLedger, RetriesExhausted, RetryPolicy, State, ToolCallError
from idemops_client.client import ToolInfo
from idemops_client.faults import FaultProxy
from idemops_demo.models import Order
from tests.support.processes import manage
from tools_app.models import IdempotencyRecord, PreparedOperation, RecordStatus

pytestmark = pytest.mark.live

QUICK = RetryPolicy(max_attempts=5, max_seconds=30, base_delay=0.01, max_delay=0.05, attempt_timeout=10)
PAYMENT = {"amount": "12.34", "currency": "EUR", "payee": "Bolt Ltd"}
ORDER = {"customer": "ACME", "currency": "EUR", "items": [{"sku": "BOLT-1", "quantity": 3, "unit_price": "2.50"}]}


@asynccontextmanager
async def agent(web, token, *, ledger=None, session="chat-42", policy=QUICK):
    async with FaultProxy(web.base_url) as proxy:
        async with IdempotentClient(proxy.url_for(web.mcp_url), token, ledger=ledger or MemoryLedger(),
                                    session_id=session, policy=policy) as client:
            yield proxy, client


def the_payment() -> IdempotencyRecord:
    return IdempotencyRecord.objects.get(tool="request_payment")


def test_a_high_risk_tool_is_called_with_the_operation_id_the_server_issued(web_server, token, downstreams, gateway):
    async def scenario():
        async with agent(web_server, token) as (proxy, client):
            result = await client.call("request_payment", PAYMENT)
            return result, proxy.calls(), client.ledger.entries()

    result, requests, entries = asyncio.run(scenario())

    assert [r.tool for r in requests] == ["prepare_operation", "request_payment"]
    issued = requests[0].structured["operation_id"]
    assert requests[0].arguments == {"tool": "request_payment", "arguments": PAYMENT}
    assert requests[1].key == result.key == entries[0].key == issued == result.operation_id
    assert str(the_payment().operation_id) == issued
    [(payment_id, operation_id)] = gateway.sql("SELECT id, operation_id FROM payments")
    assert result["payment_id"] == payment_id and operation_id == issued


def test_a_replanned_high_risk_call_is_answered_from_the_ledger_without_preparing_again(web_server, token,
                                                                                       downstreams, gateway):
    async def scenario():
        async with agent(web_server, token) as (proxy, client):
            first = await client.call("request_payment", PAYMENT)
            again = await client.call("request_payment", {"payee": "Bolt Ltd", "currency": "EUR", "amount": "12.34"})
            return first, again, proxy.calls()

    first, again, requests = asyncio.run(scenario())

    assert again.from_ledger and again.key == first.key
    assert [r.tool for r in requests] == ["prepare_operation", "request_payment"]


def test_a_client_that_lost_its_ledger_is_issued_the_same_id_and_gets_the_replay(web_server, token, downstreams,
                                                                                gateway):
    async def scenario():
        async with agent(web_server, token) as (_, client):
            first = await client.call("request_payment", PAYMENT)
        async with agent(web_server, token, ledger=MemoryLedger()) as (_, client):
            again = await client.call("request_payment", PAYMENT)
        return first, again

    first, again = asyncio.run(scenario())

    assert again.key == first.key and again.replayed and not again.from_ledger
    assert len(gateway.payments()) == 1 and PreparedOperation.objects.count() == 1


def test_a_lost_answer_to_a_high_risk_call_is_asked_again_with_the_same_issued_id(web_server, token, downstreams,
                                                                                 gateway):
    async def scenario():
        async with agent(web_server, token) as (proxy, client):
            proxy.inject("drop_response", "request_payment")
            result = await client.call("request_payment", PAYMENT)
            return result, proxy.calls()

    result, requests = asyncio.run(scenario())

    assert [r.tool for r in requests] == ["prepare_operation", "request_payment", "request_payment"]
    assert requests[1].key == requests[2].key == result.key and result.replayed
    assert len(gateway.payments()) == 1


def test_an_issued_id_that_expired_unused_in_the_ledger_is_refused_then_prepared_anew_once(
        web_server, token, downstreams, gateway):
    async def turn(ledger, policy, fault=None):
        async with agent(web_server, token, ledger=ledger, policy=policy) as (proxy, client):
            if fault:
                proxy.inject(fault, "request_payment", retry_after=0)
            try:
                outcome = await client.call("request_payment", PAYMENT)
            except RetriesExhausted as error:
                outcome = error
            return outcome, proxy.calls(), client.ledger.entries()[0]

    # given an agent whose payment was never let through (a 503), its budget spent, its id in its ledger
    ledger = MemoryLedger()
    stopped, _, entry = asyncio.run(turn(ledger, RetryPolicy(max_attempts=1), fault="unavailable"))
    first_id = entry.key
    # and time passes: the id's time to be used runs out
    IdempotencyRecord.objects.filter(tool="prepare_operation").update(expires_at=timezone.now() - timedelta(seconds=1))

    # when it calls again
    result, requests, entry = asyncio.run(turn(ledger, QUICK))

    # then the server refuses the lapsed id (nothing ran), the client prepares once more and pays once
    assert stopped.error_class == "unavailable" and entry.key == result.key != first_id
    assert [r.tool for r in requests] == ["request_payment", "prepare_operation", "request_payment"]
    refused = requests[0].structured["error"]
    assert refused["class"] == "invalid_input" and refused["operation_id_required"] and requests[0].key == first_id
    assert len(gateway.payments()) == 1 and str(the_payment().operation_id) == result.key


def test_a_client_whose_tools_list_predates_the_flag_is_refused_then_prepares_and_calls_again_once(
        web_server, token, downstreams, gateway):
    async def scenario():
        async with agent(web_server, token) as (proxy, client):
            tools = await client.tools()
            # listed before the server flagged the tool: the client does not know it must prepare
            tools["request_payment"] = ToolInfo("request_payment", writes=True)
            result = await client.call("request_payment", PAYMENT)
            return result, proxy.calls()

    result, requests = asyncio.run(scenario())

    assert [r.tool for r in requests] == ["request_payment", "prepare_operation", "request_payment"]
    assert requests[0].key.startswith("ik-") and requests[0].structured["error"]["operation_id_required"]
    assert requests[2].key == requests[1].structured["operation_id"] == result.key
    assert len(gateway.payments()) == 1


def test_an_explicit_key_the_server_refuses_is_a_clear_invalid_input_and_nothing_is_prepared(
        web_server, token, downstreams, gateway):
    async def scenario():
        async with agent(web_server, token) as (proxy, client):
            with pytest.raises(ToolCallError) as raised:
                await client.call("request_payment", PAYMENT, key="made-up-by-the-model")
            return raised.value, proxy.calls()

    error, requests = asyncio.run(scenario())

    assert error.error_class == "invalid_input" and "prepare_operation" in error.message
    assert error.error["operation_id_required"] is True
    assert [r.tool for r in requests] == ["request_payment"] and gateway.payments() == []
    assert not IdempotencyRecord.objects.exists()


def test_a_change_to_a_declared_non_business_field_is_the_same_operation(web_server, token):
    async def scenario():
        async with agent(web_server, token) as (proxy, client):
            first = await client.call("create_order", {**ORDER, "note": "first plan"})
            again = await client.call("create_order", {**ORDER, "note": "re-planned, reworded"})
            sent = len(proxy.calls("create_order"))
        async with agent(web_server, token, ledger=MemoryLedger()) as (_, client):
            elsewhere = await client.call("create_order", {**ORDER, "note": "a third wording"})
        return first, again, sent, elsewhere

    first, again, sent, elsewhere = asyncio.run(scenario())

    assert again.from_ledger and sent == 1
    assert elsewhere.key == first.key and elsewhere.replayed
    assert Order.objects.count() == 1


def test_refresh_learns_from_get_operation_what_became_of_an_unfinished_call(web_server, token, downstreams,
                                                                            gateway):
    # given a payment the gateway made but never answered: unknown, and the client's budget ran out
    gateway.set_fault("*", "succeed-then-hang", times=1)

    async def scenario():
        async with agent(web_server, token, policy=RetryPolicy(max_attempts=1, attempt_timeout=10)) as (proxy, client):
            with pytest.raises(RetriesExhausted) as raised:
                await client.call("request_payment", PAYMENT)
            before = [e.state for e in client.ledger.entries()]
            # when reconciliation finds the payment, and the agent asks about its unfinished calls
            await asyncio.to_thread(manage, "reconcile", env=downstreams)
            updated = await client.refresh()
            again = await client.call("request_payment", PAYMENT)
            return raised.value, before, updated, again, proxy.calls()

    error, before, updated, again, requests = asyncio.run(scenario())

    # then the ledger holds the reconciled payment, and the re-planned call is answered from it
    assert error.error_class == "unknown_outcome" and before == [State.UNKNOWN]
    [(payment_id,)] = gateway.sql("SELECT id FROM payments")
    assert [(e.state, e.result["payment_id"]) for e in updated] == [(State.DONE, payment_id)]
    assert again.from_ledger and again["payment_id"] == payment_id
    assert [r.tool for r in requests] == ["prepare_operation", "request_payment", "get_operation"]
    assert requests[2].arguments == {"operation_id": updated[0].operation_id} == {"operation_id": again.key}
    assert the_payment().status == RecordStatus.SUCCEEDED


def test_get_operation_is_a_read_for_the_client_though_it_takes_an_idempotency_key(web_server, token):
    async def scenario():
        async with agent(web_server, token) as (proxy, client):
            order = await client.call("create_order", ORDER)
            found = await client.call("get_operation", {"tool": "create_order", "idempotency_key": order.key})
            return order, found, client.ledger.entries(), proxy.calls("get_operation")

    order, found, entries, requests = asyncio.run(scenario())

    assert (found["status"], found["result"]["order_id"]) == ("succeeded", order["order_id"])
    assert [e.tool for e in entries] == ["create_order"] and found.key is None
    assert requests[0].arguments == {"tool": "create_order", "idempotency_key": order.key}


def test_refresh_keeps_a_call_that_failed_transiently_as_submitted_and_a_later_call_runs_it_once(
        web_server, token, downstreams, gateway):
    gateway.set_fault("*", "unavailable", times=1)  # the gateway refuses the first payment: nothing done

    async def scenario():
        async with agent(web_server, token, policy=RetryPolicy(max_attempts=1)) as (_, client):
            with pytest.raises(RetriesExhausted) as raised:
                await client.call("request_payment", PAYMENT)
            updated = await client.refresh()
            await asyncio.to_thread(IdempotencyRecord.objects.filter(tool="request_payment").update,
                                    retry_not_before=timezone.now())  # the gateway's Retry-After has passed
            paid = await client.call("request_payment", PAYMENT, policy=QUICK)
            return raised.value, updated, paid

    error, updated, paid = asyncio.run(scenario())

    assert error.error_class == "transient"
    assert [(e.state, e.error["class"]) for e in updated] == [(State.SUBMITTED, "transient")]
    assert not paid.replayed and [p[0] for p in gateway.payments()] == [paid["payment_id"]]
