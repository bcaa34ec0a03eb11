"""A lost answer costs one call: every request runs in an SDK session of its own (issue 25 §2).

With one SDK session serving every call, a broken response stream failed every request in
flight on it and each was retried. Here N calls run at once through the fault proxy, one
answer is lost, and the proxy counts the requests: N + 1, one key sent twice.
"""

import asyncio

import pytest

from idemops_client import IdempotentClient, MemoryLedger, RetryPolicy
from idemops_client.faults import FaultProxy
from idemops_demo.models import Order

pytestmark = pytest.mark.live

QUICK = RetryPolicy(max_attempts=6, max_seconds=60, base_delay=0.05, max_delay=0.5, attempt_timeout=10)
N = 8


def order(n: int) -> dict:
    return {"customer": f"Customer {n}", "currency": "EUR",
            "items": [{"sku": "BOLT-1", "quantity": n + 1, "unit_price": "2.50"}]}


def test_one_answer_lost_among_concurrent_calls_retries_exactly_that_call(web_server, token):
    async def scenario():
        async with FaultProxy(web_server.base_url) as proxy:
            async with IdempotentClient(proxy.url_for(web_server.mcp_url), token, ledger=MemoryLedger(),
                                        policy=QUICK) as client:
                await client.tools()
                # The first request's answer is dropped; the others are held back a little at the
                # proxy, so they are in flight when it is.
                proxy.inject("drop_response", "create_order", times=1)
                proxy.inject("delay", "create_order", times=N - 1, seconds=0.5)
                results = await asyncio.gather(*(client.call("create_order", order(n)) for n in range(N)))
            await proxy.settle()
            return results, proxy.calls("create_order")

    results, requests = asyncio.run(scenario())

    assert len(requests) == N + 1
    keys = [r.key for r in requests]
    assert sorted(keys.count(k) for k in set(keys)) == [1] * (N - 1) + [2]
    assert sorted(r.attempts for r in results) == [1] * (N - 1) + [2]
    assert Order.objects.count() == N
    assert sorted(r["order_id"] for r in results) == sorted(Order.objects.values_list("pk", flat=True))


def test_after_the_first_discovery_each_call_is_one_http_request(web_server, token):
    async def scenario():
        async with FaultProxy(web_server.base_url) as proxy:
            async with IdempotentClient(proxy.url_for(web_server.mcp_url), token, ledger=MemoryLedger(),
                                        policy=QUICK) as client:
                await client.tools()
                before = sum(proxy.counts().values())
                await asyncio.gather(*(client.call("create_order", order(n)) for n in range(3)))
                return sum(proxy.counts().values()) - before, proxy.counts()

    requests, counts = asyncio.run(scenario())

    assert requests == 3, counts
    assert counts[("server/discover", None)] == 1 and counts[("initialize", None)] == 0
