"""The load generator of the HTTP benchmarks: JSON-RPC `tools/call` POSTs over kept-alive HTTP/1.1.

Plain asyncio streams and a hand-written request, so the generator spends as little of the
machine's two cores as it can (the servers it measures share them). Each client is one connection
sending one request at a time; a response is read whole (Content-Length or chunked, as the SDK's
Streamable HTTP answers with server-sent events) and checked to be a successful tool result.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from urllib.parse import urlsplit


class CallFailed(Exception):
    pass


def call_body(tool: str, arguments: dict) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                       "params": {"name": tool, "arguments": arguments}}).encode()


async def load(url: str, token: str | None, body: Callable[[], bytes], concurrency: int,
               seconds: float) -> tuple[list[float], float]:
    """Call for `seconds` with `concurrency` clients, each making one call at least (a client whose
    connection took longer than `seconds` still measures one): (latencies in ms, wall seconds)."""
    parts = urlsplit(url)
    head = (f"POST {parts.path} HTTP/1.1\r\nHost: {parts.hostname}:{parts.port}\r\n"
            "Accept: application/json, text/event-stream\r\nContent-Type: application/json\r\n"
            + (f"Authorization: Bearer {token}\r\n" if token else "")).encode()
    latencies: list[float] = []
    deadline = time.monotonic() + seconds

    async def client() -> None:
        reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
        try:
            while True:
                payload = body()
                started = time.perf_counter()
                writer.write(head + b"Content-Length: %d\r\n\r\n" % len(payload) + payload)
                status, response = await _response(reader)
                latencies.append((time.perf_counter() - started) * 1000)
                if status != 200 or b'"isError":false' not in response.replace(b" ", b""):
                    raise CallFailed(f"HTTP {status}: {response[:300]!r}")
                if time.monotonic() >= deadline:
                    break
        finally:
            writer.close()

    started = time.monotonic()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    return latencies, time.monotonic() - started


async def _response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    header = await reader.readuntil(b"\r\n\r\n")
    lines = header.split(b"\r\n")
    status = int(lines[0].split()[1])
    fields = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        fields[name.strip().lower()] = value.strip().lower()
    if fields.get(b"transfer-encoding") == b"chunked":
        chunks = []
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                await reader.readuntil(b"\r\n")
                return status, b"".join(chunks)
            chunks.append((await reader.readexactly(size + 2))[:-2])
    return status, await reader.readexactly(int(fields.get(b"content-length", b"0")))


def run_load(url: str, token: str | None, body: Callable[[], bytes], concurrency: int,
             seconds: float) -> tuple[list[float], float]:
    return asyncio.run(load(url, token, body, concurrency, seconds))
