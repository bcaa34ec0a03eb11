"""Server-issued operation ids, get_operation and declared non-business fields, from the client's side.

The platform does not serve prepare_operation / get_operation yet; these
tests run the client against tests/client/contract_server.py, a real MCP
server over real HTTP that follows the contract in idemops_client/README.md.
(Without those tools, the client derives keys: see test_client_live.py.)
"""

import asyncio
from contextlib import asynccontextmanager

import pytest

from idemops_client import IdempotentClient, MemoryLedger, RetriesExhausted, RetryPolicy, State, ToolCallError
from idemops_client.faults import FaultProxy
from tests.client.contract_server import ContractServer

QUICK = RetryPolicy(max_attempts=5, max_seconds=30, base_delay=0.01, max_delay=0.05, attempt_timeout=10)
PAYMENT = {"amount": "12.34", "payee": "Bolt Ltd"}


@pytest.fixture
def server():
    contract = ContractServer()
    yield contract
    contract.stop()


@asynccontextmanager
async def agent(server, *, ledger=None, session="chat-42", policy=QUICK):
    upstream = server.mcp_url.removesuffix("/mcp")
    async with FaultProxy(upstream) as proxy:
        async with IdempotentClient(proxy.url_for(server.mcp_url), ledger=ledger or MemoryLedger(),
                                    session_id=session, policy=policy) as client:
            yield proxy, client


def test_a_high_risk_tool_is_called_with_the_operation_id_the_server_issued(server):
    async def scenario():
        async with agent(server) as (proxy, client):
            result = await client.call("pay", PAYMENT)
            return result, proxy.calls(), client.ledger.entries()

    result, requests, entries = asyncio.run(scenario())

    assert [r.tool for r in requests] == ["prepare_operation", "pay"]
    issued = requests[0].structured["operation_id"]
    assert requests[1].key == result.key == entries[0].key == issued
    assert requests[0].arguments == {"tool": "pay", "arguments": PAYMENT}
    assert result["payment_id"] == "pay-1" and len(server.executions) == 1


def test_a_replanned_high_risk_call_is_answered_from_the_ledger_without_preparing_again(server):
    async def scenario():
        async with agent(server) as (proxy, client):
            first = await client.call("pay", PAYMENT)
            again = await client.call("pay", {"payee": "Bolt Ltd", "amount": "12.34"})
            return first, again, proxy.calls()

    first, again, requests = asyncio.run(scenario())

    assert again.from_ledger and again.key == first.key
    assert [r.tool for r in requests] == ["prepare_operation", "pay"]


def test_a_client_that_lost_its_ledger_is_issued_the_same_id_and_gets_the_replay(server):
    async def scenario():
        async with agent(server) as (_, client):
            first = await client.call("pay", PAYMENT)
        async with agent(server, ledger=MemoryLedger()) as (_, client):
            again = await client.call("pay", PAYMENT)
        return first, again

    first, again = asyncio.run(scenario())

    assert again.key == first.key and again.replayed and not again.from_ledger
    assert len(server.executions) == 1


def test_a_lost_answer_to_a_high_risk_call_is_asked_again_with_the_same_issued_id(server):
    async def scenario():
        async with agent(server) as (proxy, client):
            proxy.inject("drop_response", "pay")
            result = await client.call("pay", PAYMENT)
            return result, proxy.calls()

    result, requests = asyncio.run(scenario())

    assert [r.tool for r in requests] == ["prepare_operation", "pay", "pay"]
    assert requests[1].key == requests[2].key == result.key and result.replayed
    assert len(server.executions) == 1 and server.prepare_calls == 1


def test_a_tool_that_refuses_a_client_made_key_is_prepared_and_called_again_once(server):
    async def scenario():
        async with agent(server) as (proxy, client):
            result = await client.call("pay_unflagged", PAYMENT)
            return result, proxy.calls()

    result, requests = asyncio.run(scenario())

    assert [r.tool for r in requests] == ["pay_unflagged", "prepare_operation", "pay_unflagged"]
    assert requests[0].key.startswith("ik-") and requests[0].structured["error"]["operation_id_required"]
    assert requests[2].key == requests[1].structured["operation_id"] == result.key
    assert len(server.executions) == 1


def test_an_explicit_key_the_server_refuses_is_a_clear_invalid_input_and_nothing_is_prepared(server):
    async def scenario():
        async with agent(server) as (proxy, client):
            with pytest.raises(ToolCallError) as raised:
                await client.call("pay", PAYMENT, key="made-up-by-the-model")
            return raised.value, proxy.calls()

    error, requests = asyncio.run(scenario())

    assert error.error_class == "invalid_input" and "prepare_operation" in error.message
    assert [r.tool for r in requests] == ["pay"] and server.executions == []


def test_a_change_to_a_declared_non_business_field_is_the_same_operation(server):
    async def scenario():
        async with agent(server) as (proxy, client):
            first = await client.call("note_order", {"customer": "ACME", "note": "first plan"})
            again = await client.call("note_order", {"customer": "ACME", "note": "re-planned, reworded"})
            sent = len(proxy.calls("note_order"))
        async with agent(server, ledger=MemoryLedger()) as (_, client):
            elsewhere = await client.call("note_order", {"customer": "ACME", "note": "a third wording"})
        return first, again, sent, elsewhere

    first, again, sent, elsewhere = asyncio.run(scenario())

    assert again.from_ledger and sent == 1
    assert elsewhere.key == first.key and elsewhere.replayed
    assert len(server.executions) == 1


def test_refresh_learns_from_get_operation_what_became_of_an_unfinished_call(server):
    async def scenario():
        policy = RetryPolicy(max_attempts=2, max_seconds=30, base_delay=0.01, max_delay=0.05)
        async with agent(server, policy=policy) as (proxy, client):
            with pytest.raises(RetriesExhausted) as raised:
                await client.call("slow_order", {"customer": "ACME"})
            before = [e.state for e in client.ledger.entries()]
            server.finish()
            updated = await client.refresh()
            again = await client.call("slow_order", {"customer": "ACME"})
            return raised.value, before, updated, again, proxy.calls()

    error, before, updated, again, requests = asyncio.run(scenario())

    assert error.error_class == "in_progress" and before == [State.IN_PROGRESS]
    assert [(e.state, e.result) for e in updated] == [(State.DONE, {"order": "finished"})]
    assert again.from_ledger and again["order"] == "finished"
    assert [r.tool for r in requests] == ["slow_order", "slow_order", "get_operation"]
    assert requests[2].arguments == {"operation_id": updated[0].operation_id}
