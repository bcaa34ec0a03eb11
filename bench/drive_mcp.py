"""The Python of one /mcp call, without an HTTP server: the ASGI apps driven in this process.

    .venv/bin/python bench/drive_mcp.py [--rounds 5] [--requests 500] [--profile FILE]

Sends `tools/call` requests straight to the ASGI apps (their lifespans run, no sockets, no load
generator): the bare SDK's no-op (bench/bare_mcp.py), the floor's `create_order` (bench/floor_mcp.py),
idemops' `whoami` and `create_order` (a new key each), in interleaved rounds on a fresh benchmark
database. Prints the CPU time per request of each (the process's: the event loop's thread and the
database threads), each against the bare SDK's, and the wall time per request: what idemops' own
Python adds to a call, which over HTTP is hidden in the server's and the load generator's time; and
the floor's wall time over idemops' `create_order`'s, P10's one-client cell without HTTP.
`--profile FILE` writes a cProfile of idemops' `whoami` rounds (the event loop's thread only) to
FILE, for `python -m pstats FILE`.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import logging
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import setup_django

App = Callable[[dict[str, Any], Callable[[], Awaitable[dict[str, Any]]], Callable[[dict[str, Any]], Awaitable[None]]],
               Awaitable[None]]


async def started(app: App) -> asyncio.Queue[dict[str, Any]]:
    """Runs `app`'s lifespan until its start-up completes; put {"type": "lifespan.shutdown"} in the queue to stop it."""
    inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    outbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    await inbox.put({"type": "lifespan.startup"})
    asyncio.get_running_loop().create_task(app({"type": "lifespan", "asgi": {"version": "3.0"}}, inbox.get, outbox.put))
    assert (await outbox.get())["type"] == "lifespan.startup.complete"
    return inbox


async def call(app: App, token: str | None, tool: str, arguments: dict[str, Any]) -> None:
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                       "params": {"name": tool, "arguments": arguments}}).encode()
    headers = [(b"host", b"127.0.0.1:8000"), (b"accept", b"application/json, text/event-stream"),
               (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if token:
        headers.append((b"authorization", f"Bearer {token}".encode()))
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/mcp", "raw_path": b"/mcp", "query_string": b"", "root_path": "", "headers": headers,
             "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 50000)}
    messages: list[dict[str, Any]] = []
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        if pending:
            return pending.pop()
        await asyncio.Event().wait()  # the client never disconnects
        raise AssertionError

    async def send(message: dict[str, Any]) -> None:
        messages.append(message)

    await app(scope, receive, send)
    answer = b"".join(m.get("body", b"") for m in messages if m["type"] == "http.response.body")
    if messages[0]["status"] != 200 or b'"isError":false' not in answer.replace(b" ", b""):
        raise RuntimeError(f"HTTP {messages[0]['status']}: {answer[:300]!r}")


async def main(args: argparse.Namespace, token: str) -> None:
    from bench.bare_mcp import app as bare
    from bench.bench_mcp import ORDER
    from bench.floor_mcp import app as floor
    from idemops.asgi import application as idemops

    def new_order() -> dict[str, Any]:
        return {**ORDER, "idempotency_key": uuid.uuid4().hex}

    cases: dict[str, tuple[App, str | None, str, Callable[[], dict[str, Any]]]] = {
        "bare SDK, no-op": (bare, None, "noop", dict),
        "floor, create_order": (floor, None, "create_order", new_order),
        "idemops whoami": (idemops, token, "whoami", dict),
        "idemops create_order": (idemops, token, "create_order", new_order),
    }
    stops = [await started(bare), await started(floor), await started(idemops)]
    profile = cProfile.Profile() if args.profile else None
    cpu: dict[str, list[float]] = {name: [] for name in cases}
    wall: dict[str, list[float]] = {name: [] for name in cases}
    for round_number in range(args.rounds + 1):  # round 0 warms up: connections, caches, prepared statements
        for name, (app, key, tool, arguments) in cases.items():
            measured = profile is not None and name == "idemops whoami" and round_number > 0
            if measured:
                profile.enable()  # type: ignore[union-attr]
            started_at, clock = time.process_time(), time.perf_counter()
            for _ in range(args.requests):
                await call(app, key, tool, arguments())
            if measured:
                profile.disable()  # type: ignore[union-attr]
            if round_number > 0:
                cpu[name].append((time.process_time() - started_at) / args.requests * 1e6)
                wall[name].append((time.perf_counter() - clock) / args.requests * 1e6)
    for stop in stops:
        await stop.put({"type": "lifespan.shutdown"})
    bare_cpu = cpu["bare SDK, no-op"]
    print("| call | CPU µs a request (median of rounds) | rounds | ÷ the bare SDK's | wall µs a request (median) |")
    print("| --- | ---: | --- | ---: | ---: |")
    for name, figures in cpu.items():
        ratios = [ours / anchor for ours, anchor in zip(figures, bare_cpu, strict=True)]
        print(f"| {name} | {statistics.median(figures):.0f} | {', '.join(f'{f:.0f}' for f in figures)} | "
              f"{statistics.median(ratios):.2f}× | {statistics.median(wall[name]):.0f} |")
    floor_wall, ours_wall = wall["floor, create_order"], wall["idemops create_order"]
    print(f"\ncreate_order's wall time, the floor's ÷ idemops' (P10's one-client cell without HTTP): "
          f"{statistics.median(f / o for f, o in zip(floor_wall, ours_wall, strict=True)):.2f}×")
    if profile is not None:
        profile.dump_stats(args.profile)
        print(f"profile of idemops whoami written to {args.profile}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--profile", type=Path)
    options = parser.parse_args()
    logging.disable(logging.INFO)  # the SDK logs every stateless request's end at INFO
    setup_django()
    import idemops.asgi  # noqa: F401  (its start-up reads the database: before the event loop runs)
    from bench.bench_mcp import agent_token

    asyncio.run(main(options, agent_token("drive")))
