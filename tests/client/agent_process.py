"""An agent process for the restart tests: one create_order through its own fault proxy, then exit.

    python -m tests.client.agent_process URL TOKEN LEDGER SESSION CUSTOMER [--drop N] [--attempts N]

Prints one JSON line: the result (order id, key, replayed, from_ledger) or the
error class, and the tools/call requests its proxy saw. Imports no Django.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from urllib.parse import urlsplit

from idemops_client import IdempotentClient, Ledger, RetryPolicy, ToolCallError
from idemops_client.faults import FaultProxy


async def main(args: argparse.Namespace) -> dict:
    parts = urlsplit(args.url)
    async with FaultProxy(f"{parts.scheme}://{parts.netloc}") as proxy:
        if args.drop:
            proxy.inject("drop_response", "create_order", times=args.drop)
        ledger = Ledger(args.ledger)
        policy = RetryPolicy(max_attempts=args.attempts, max_seconds=3600, base_delay=0.05, max_delay=0.2,
                             attempt_timeout=10)
        async with IdempotentClient(proxy.url_for(args.url), args.token, ledger=ledger, session_id=args.session,
                                    policy=policy) as client:
            order = {"customer": args.customer, "currency": "EUR",
                     "items": [{"sku": "BOLT-1", "quantity": 3, "unit_price": "2.50"}]}
            try:
                result = await client.call("create_order", order)
                outcome = {"order_id": result["order_id"], "key": result.key, "replayed": result.replayed,
                           "from_ledger": result.from_ledger}
            except ToolCallError as error:
                outcome = {"error_class": error.error_class, "key": error.key}
        outcome["requests"] = len(proxy.calls("create_order"))
        return outcome


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    for name in ("url", "token", "ledger", "session", "customer"):
        parser.add_argument(name)
    parser.add_argument("--drop", type=int, default=0)
    parser.add_argument("--attempts", type=int, default=6)
    print(json.dumps(asyncio.run(main(parser.parse_args()))), flush=True)
