"""Issue 2 (c): create_order over /mcp vs the no-op read tool `whoami`, 1 and 32 concurrent clients.

A real uvicorn process serves idemops on the benchmark database; the load is
plain JSON-RPC `tools/call` POSTs from one asyncio process (stateless
Streamable HTTP needs no initialize). Each (concurrency, tool) pair runs
twice, interleaved, and the runs are pooled.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid

from bench.common import ROOT, row, summary

DURATION_SECONDS = 6
MCP_NOTE = (
    "Reading: a `whoami` call is nearly all fixed cost (HTTP, the SDK's stateless Streamable HTTP request with "
    "SSE framing, the bearer-token lookup, the hop to a database thread); `create_order` adds the engine's two "
    "durable commits, the order and its lines and the audit rows. The "
    "load generator shares the machine's two cores with the server.")
CONCURRENCY = (1, 32)
ORDER = {"customer": "ACME", "items": [{"sku": "BOLT-1", "quantity": 3, "unit_price": "2.50"}], "currency": "EUR"}


async def load(url: str, token: str, tool: str, concurrency: int, duration: float) -> tuple[list[float], float]:
    import httpx2

    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream"}
    latencies: list[float] = []
    deadline = time.monotonic() + duration

    async def worker(client) -> None:
        while time.monotonic() < deadline:
            arguments = {**ORDER, "idempotency_key": uuid.uuid4().hex} if tool == "create_order" else {}
            body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": tool, "arguments": arguments}}
            start = time.perf_counter()
            response = await client.post(url, json=body, headers=headers)
            latencies.append((time.perf_counter() - start) * 1000)
            data = json.loads(response.text.split("data: ", 1)[1])
            assert not data["result"]["isError"], data

    limits = httpx2.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx2.AsyncClient(timeout=60, limits=limits) as client:
        started = time.monotonic()
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
        return latencies, time.monotonic() - started


def start_server() -> tuple[subprocess.Popen, str]:
    from tests.processes import free_port

    port = free_port()
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "idemops.settings", "IDEMOPS_LOG_LEVEL": "WARNING",
           "IDEMOPS_PUBLIC_URL": f"http://127.0.0.1:{port}"}
    server = subprocess.Popen([sys.executable, "-m", "uvicorn", "idemops.asgi:application", "--port", str(port),
                               "--no-access-log", "--log-level", "warning"], cwd=ROOT, env=env)
    import urllib.request

    for _ in range(100):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1)
            break
        except OSError:
            time.sleep(0.2)
    return server, f"http://127.0.0.1:{port}/mcp"


def run() -> str:
    from django.contrib.auth import get_user_model

    from tools_app import access

    tenant = access.create_tenant("bench-mcp")
    owner, _ = get_user_model().objects.get_or_create(username="bench-owner")
    _, token = access.issue_token(tenant, f"bench-{uuid.uuid4().hex[:6]}", owner=owner)
    server, url = start_server()
    try:
        results: dict[tuple[int, str], tuple[list[float], float]] = {}
        for concurrency in CONCURRENCY:
            asyncio.run(load(url, token, "whoami", concurrency, 1))  # warm up connections and threads
            for _ in range(2):
                for tool in ("whoami", "create_order"):
                    latencies, wall = asyncio.run(load(url, token, tool, concurrency, DURATION_SECONDS / 2))
                    pooled, total = results.get((concurrency, tool), ([], 0.0))
                    results[(concurrency, tool)] = (pooled + latencies, total + wall)
    finally:
        server.terminate()
        server.wait()
    lines = ["## Tool calls over /mcp (issue 2 c)", "",
             f"One uvicorn process, plain JSON-RPC POSTs, {DURATION_SECONDS}s per tool and concurrency "
             "(two interleaved halves). `whoami` is a read tool that touches no table.", "",
             "| Tool, concurrent clients | median ms | p99 ms | calls/s |", "| --- | ---: | ---: | ---: |"]
    ratios = []
    for concurrency in CONCURRENCY:
        stats = {tool: summary(*results[(concurrency, tool)]) for tool in ("whoami", "create_order")}
        lines += [row(f"whoami, {concurrency}", stats["whoami"]), row(f"create_order, {concurrency}",
                                                                        stats["create_order"])]
        ratios.append(f"- {concurrency} client(s): create_order / whoami throughput = "
                      f"**{stats['create_order']['per_s'] / stats['whoami']['per_s']:.2f}×** (target ≥ 0.7×)")
    return "\n".join([*lines, "", *ratios, "", MCP_NOTE, ""])
