"""Issue 36 §2 and §4, across real processes: an open breaker answers without running, in every web
process (counted: no request reaches the gateway, no record is claimed), one probe closes it; and
the calls in flight to one downstream stay within its limit, whichever web process sends them."""

import asyncio
import time

import httpx2
import pytest

from tests.support.agents import call_tool, issued_operation_id
from tests.support.processes import Stack, manage
from tools_app.core import polling

PAYMENT = {"amount": "12.00", "currency": "EUR", "payee": "Bob", "reference": "breaker"}
RECORDS = "tools_app_idempotencyrecord"


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    # Two web processes; a breaker that opens after 3 failures and probes every 3 s; two calls in flight
    # to a downstream at most; each process re-reads the shared state every half second.
    stack = Stack(tmp_path_factory.mktemp("breaker"), "breaker", IDEMOPS_BREAKER_FAILURES="3",
                  IDEMOPS_BREAKER_OPEN_SECONDS="3", IDEMOPS_DOWNSTREAM_MAX_IN_FLIGHT="2",
                  IDEMOPS_INCIDENT_STATE_SECONDS="0.5", IDEMOPS_PAYMENT_GATEWAY_TIMEOUT_SECONDS="10")
    stack.other = stack.web_server("web-b")
    yield stack
    stack.stop()


async def _keys(stack: Stack, client: httpx2.AsyncClient, label: str, n: int) -> list[str]:
    return [await issued_operation_id(client, stack.web.mcp_url, stack.token, "request_payment", PAYMENT,
                                      f"{label}-{i}", [], time.monotonic() + 60) for i in range(n)]


def _posts(stack: Stack) -> int:
    return stack.gateway.sql("SELECT count(*) FROM requests_seen WHERE method = 'POST' AND path = '/payments'")[0][0]


def _breaker(stack: Stack) -> str | None:
    rows = stack.sql("SELECT state FROM tools_app_downstream WHERE name = 'payment-gateway'")
    return rows[0][0] if rows else None


def test_an_open_breaker_answers_in_every_web_process_without_running_and_one_probe_closes_it(stack):
    async def scenario():
        async with httpx2.AsyncClient(timeout=60) as client:
            keys = await _keys(stack, client, "breaker", 6)
            # given: the gateway refuses, nothing done, and three payments through web A hear so
            stack.gateway.set_fault("*", "unavailable")
            for key in keys[:3]:
                answer = await call_tool(client, stack.web.mcp_url, stack.token, "request_payment",
                                         {**PAYMENT, "idempotency_key": key})
                assert answer.error_class == "transient" and "circuit_open" not in answer.error
            assert _breaker(stack) == "open"
            await asyncio.sleep(1)  # every process re-reads the state within half a second
            posts = _posts(stack)

            # when: new payments come through web B while the breaker is open
            held = [await call_tool(client, stack.other.mcp_url, stack.token, "request_payment",
                                    {**PAYMENT, "idempotency_key": key}) for key in keys[3:]]

            # then: each answers transient naming the breaker, with the time to the next probe; nothing
            # reached the gateway, and no record was claimed for those keys
            assert {a.error_class for a in held} == {"transient"}
            assert all(a.error["circuit_open"] == "payment-gateway" and 0 < a.error["retry_after"] <= 3 for a in held)
            assert _posts(stack) == posts
            assert stack.sql(f"SELECT count(*) FROM {RECORDS} WHERE key = ANY(%s)", [keys[3:]])[0][0] == 0

            # when: the gateway recovers and, after the probe's time, a call comes through web B
            stack.gateway.clear_fault("*")
            await asyncio.sleep(3.5)
            probe = await call_tool(client, stack.other.mcp_url, stack.token, "request_payment",
                                    {**PAYMENT, "idempotency_key": keys[3]})

            # then: that one call probed and paid, and the breaker closed for every process
            assert probe.succeeded, probe.body
            assert _breaker(stack) == "closed"
            await asyncio.sleep(1)
            rest = [await call_tool(client, stack.web.mcp_url, stack.token, "request_payment",
                                    {**PAYMENT, "idempotency_key": key}) for key in keys]
            assert all(a.succeeded for a in rest), [a.body for a in rest if not a.succeeded]
            assert len(stack.gateway.sql("SELECT 1 FROM payments WHERE operation_id = ANY(%s)", [keys])) == 6
            events = [a for (a,) in stack.sql("SELECT action FROM tools_app_auditevent WHERE object_type = "
                                              "'downstream' ORDER BY id")]
            assert events == ["breaker.opened", "breaker.probing", "breaker.closed"]

    asyncio.run(scenario())


def test_calls_in_flight_to_a_downstream_stay_within_its_limit_across_web_processes(stack):
    async def scenario():
        async with httpx2.AsyncClient(timeout=60) as client:
            keys = await _keys(stack, client, "limit", 6)
            # given: the gateway holds every payment until the test lets go
            stack.gateway.set_fault("*", "slow", seconds=60)
            posts = _posts(stack)

            # when: six payments start at once, three through each web process
            calls = [asyncio.create_task(call_tool(client, web.mcp_url, stack.token, "request_payment",
                                                   {**PAYMENT, "idempotency_key": key}))
                     for web, key in zip([stack.web, stack.other] * 3, keys, strict=True)]
            done, _ = await asyncio.wait(calls, timeout=30, return_when=asyncio.FIRST_COMPLETED)
            while len(done) < 4:
                more, _ = await asyncio.wait([c for c in calls if c not in done], timeout=30,
                                             return_when=asyncio.FIRST_COMPLETED)
                assert more, "the calls over the limit were not answered"
                done |= more

            # then: two reached the gateway; the four others answered at once, nothing sent
            over = [c.result() for c in done]
            assert all(a.error_class == "transient" and a.error["in_flight_limit"] == "payment-gateway"
                       for a in over), [a.body for a in over]
            # (the two in flight may still be on their way to the gateway)
            await asyncio.to_thread(polling.until, lambda: _posts(stack) - posts >= 2, seconds=30, pause=0.1)
            assert _posts(stack) - posts == 2
            stack.gateway.clear_fault("*")
            held = await asyncio.gather(*[c for c in calls if c not in done])
            assert all(a.succeeded for a in held)

    asyncio.run(scenario())


def test_a_paused_tool_answers_in_both_web_processes_without_running_and_runs_after_the_resume(stack):
    async def scenario():
        async with httpx2.AsyncClient(timeout=60) as client:
            keys = await _keys(stack, client, "paused", 2)
            posts = _posts(stack)
            # given: an operator pauses the tool from the shell
            manage("pause", "--tool", "request_payment", "--reason", "checking yesterday's payouts", "--user",
                   "owner", env=stack.env)
            await asyncio.sleep(1)  # every process re-reads the state within half a second

            # when: a payment comes through each web process
            answers = [await call_tool(client, web.mcp_url, stack.token, "request_payment",
                                       {**PAYMENT, "idempotency_key": key})
                       for web, key in zip([stack.web, stack.other], keys, strict=True)]

            # then: both answer transient with the operator's reason; nothing reached the gateway, nothing claimed
            assert all(a.error_class == "transient" and a.error["paused_reason"] == "checking yesterday's payouts"
                       for a in answers), [a.body for a in answers]
            assert _posts(stack) == posts
            assert stack.sql(f"SELECT count(*) FROM {RECORDS} WHERE key = ANY(%s)", [keys])[0][0] == 0

            # when: the operator resumes it; then the same keys pay, once each
            manage("resume", "--tool", "request_payment", "--user", "owner", env=stack.env)
            await asyncio.sleep(1)
            paid = [await call_tool(client, web.mcp_url, stack.token, "request_payment",
                                    {**PAYMENT, "idempotency_key": key})
                    for web, key in zip([stack.other, stack.web], keys, strict=True)]
            assert all(a.succeeded for a in paid), [a.body for a in paid]
            assert len(stack.gateway.sql("SELECT 1 FROM payments WHERE operation_id = ANY(%s)", [keys])) == 2

    asyncio.run(scenario())
