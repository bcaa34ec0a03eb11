"""A fault-injecting HTTP proxy for MCP over Streamable HTTP, on loopback.

It sits between a client and a real server and misbehaves on purpose, the
way networks and load balancers do:

- `drop_response`: forward the request, let the server finish, then close
  the client's connection without a byte of the answer (the side effect
  happened; the client cannot know);
- `disconnect`: forward the request and cut the client's connection while
  the server is still working on it (the server carries on);
- `delay`: hold the request for a while before forwarding it;
- `unavailable`: answer HTTP 503 with `Retry-After` and a JSON body
  without forwarding (what a server says while its database is down).

Faults match JSON-RPC requests by method and tool name and fire a set number
of times. Every request that reaches the proxy is recorded (method, tool,
idempotency key, the fault applied, the server's answer even when the client
never got it), so tests and the demo count round trips and side effects from
the wire instead of assuming them.

Used by the demo (`python -m idemops_client.demo`) and by the tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx2

META_KEY = "io.idemops/idempotency-key"
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "te", "trailer", "upgrade",
              "proxy-connection"}
FAULT_KINDS = ("drop_response", "disconnect", "delay", "unavailable")


@dataclass
class Fault:
    """One kind of misbehaviour for requests that match; fires `times` times."""

    kind: str
    tool: str | None = None  # None: any tool
    method: str = "tools/call"
    times: int = 1
    seconds: float = 0.3  # delay: how long; disconnect: how long after forwarding to cut
    retry_after: float = 1.0  # unavailable: the Retry-After header

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {self.kind!r}; one of {', '.join(FAULT_KINDS)}")

    def matches(self, method: str | None, tool: str | None) -> bool:
        return self.times > 0 and method == self.method and (self.tool is None or self.tool == tool)


@dataclass
class Exchange:
    """One HTTP request as the proxy saw it."""

    method: str | None  # JSON-RPC method, None for a non-JSON request
    tool: str | None
    key: str | None  # the idempotency key, from _meta or the arguments
    arguments: dict[str, Any] | None
    meta: dict[str, Any] | None = None  # the request's params._meta (the key, traceparent)
    fault: str | None = None
    status: int | None = None  # the server's HTTP status (503 for `unavailable`)
    reply: dict[str, Any] | None = None  # the JSON-RPC response the server sent
    delivered: bool = False  # the client received the answer
    at: float = field(default_factory=time.monotonic)  # when it reached the proxy
    done: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    @property
    def structured(self) -> dict[str, Any] | None:
        """The tool result's structuredContent, if the server answered one."""
        result = (self.reply or {}).get("result")
        return result.get("structuredContent") if isinstance(result, dict) else None


class FaultProxy:
    """`async with FaultProxy("http://127.0.0.1:8000") as proxy:` then point a client at `proxy.url_for(path)`."""

    def __init__(self, upstream: str, *, host: str = "127.0.0.1", port: int = 0, timeout: float = 120):
        self.upstream = upstream.rstrip("/")
        self.host = host
        self.port = port
        self.timeout = timeout
        self.faults: list[Fault] = []
        self.exchanges: list[Exchange] = []
        self._server: asyncio.Server | None = None
        self._http: httpx2.AsyncClient | None = None
        self._background: set[asyncio.Task[Any]] = set()
        self._connections: set[asyncio.Task[Any]] = set()

    # --- set-up ---------------------------------------------------------------------------

    async def __aenter__(self) -> FaultProxy:
        self._http = httpx2.AsyncClient(timeout=self.timeout)
        self._server = await asyncio.start_server(self._serve, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._server is not None and self._http is not None
        self._server.close()
        # Requests the client gave up on are still being answered upstream; let them end.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.settle(), timeout=self.timeout)
        # Connections the clients keep open between requests end here.
        for task in [*self._background, *self._connections]:
            task.cancel()
        await asyncio.gather(*self._background, *self._connections, return_exceptions=True)
        await self._http.aclose()

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def url_for(self, upstream_url: str) -> str:
        """The proxy's address for a URL on the upstream server (same path and query)."""
        if not upstream_url.startswith(self.upstream):
            raise ValueError(f"{upstream_url} is not on {self.upstream}")
        return self.base_url + upstream_url[len(self.upstream):]

    def inject(self, kind: str, tool: str | None = None, **options: Any) -> Fault:
        fault = Fault(kind, tool, **options)
        self.faults.append(fault)
        return fault

    async def settle(self) -> None:
        """Wait until every forwarded request has its answer from the server."""
        while pending := [e.done.wait() for e in self.exchanges if not e.done.is_set()]:
            await asyncio.gather(*pending)

    # --- what went over the wire ------------------------------------------------------------

    def calls(self, tool: str | None = None) -> list[Exchange]:
        return [e for e in self.exchanges if e.method == "tools/call" and (tool is None or e.tool == tool)]

    def counts(self) -> Counter[tuple[str | None, str | None]]:
        """(JSON-RPC method, tool) → requests that reached the proxy."""
        return Counter((e.method, e.tool) for e in self.exchanges)

    # --- serving ------------------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            while True:
                request = await _read_request(reader)
                if request is None:
                    return
                keep_open = await self._handle(request, writer)
                if not keep_open:
                    return
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.CancelledError):
            return
        finally:
            self._connections.discard(task)
            if not writer.is_closing():
                writer.close()

    async def _handle(self, request: _Request, writer: asyncio.StreamWriter) -> bool:
        exchange = _describe(request.body)
        self.exchanges.append(exchange)
        fault = next((f for f in self.faults if f.matches(exchange.method, exchange.tool)), None)
        if fault is not None:
            fault.times -= 1
            exchange.fault = fault.kind
        if fault is not None and fault.kind == "unavailable":
            body = json.dumps({"error": {"class": "transient", "message": "service unavailable (injected by the "
                                         "fault proxy)", "retry_after": fault.retry_after}}).encode()
            exchange.status = 503
            exchange.done.set()
            await _write_response(writer, 503, [("content-type", "application/json"),
                                                 ("retry-after", _seconds(fault.retry_after))], body)
            exchange.delivered = True
            return True
        if fault is not None and fault.kind == "delay":
            await asyncio.sleep(fault.seconds)
        # The upstream request runs on its own: a client that goes away does not cancel it.
        upstream = asyncio.create_task(self._forward(request, exchange))
        self._background.add(upstream)
        upstream.add_done_callback(self._background.discard)
        if fault is not None and fault.kind == "disconnect":
            await asyncio.wait([upstream], timeout=fault.seconds)
            writer.transport.abort()
            return False
        try:
            status, headers, body = await upstream
        except httpx2.HTTPError as exc:
            await _write_response(writer, 502, [("content-type", "text/plain")], f"upstream: {exc}".encode())
            return False
        if fault is not None and fault.kind == "drop_response":
            writer.close()
            return False
        await _write_response(writer, status, headers, body)
        exchange.delivered = True
        return True

    async def _forward(self, request: _Request, exchange: Exchange) -> tuple[int, list[tuple[str, str]], bytes]:
        assert self._http is not None
        try:
            headers = [(k, v) for k, v in request.headers if k.lower() not in HOP_BY_HOP and k.lower() != "host"]
            response = await self._http.request(request.method, self.upstream + request.target, headers=headers,
                                                content=request.body)
            exchange.status = response.status_code
            exchange.reply = _reply_of(response)
            kept = [(k, v) for k, v in response.headers.multi_items() if k.lower() not in HOP_BY_HOP]
            return response.status_code, kept, response.content
        finally:
            exchange.done.set()


# --- HTTP/1.1, the small part a local proxy needs -------------------------------------------------


@dataclass
class _Request:
    method: str
    target: str
    headers: list[tuple[str, str]]
    body: bytes


async def _read_request(reader: asyncio.StreamReader) -> _Request | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None  # the client closed the connection between requests
    lines = head.decode("latin-1").split("\r\n")
    method, target, _ = lines[0].split(" ", 2)
    headers = [(name.strip(), value.strip()) for name, sep, value in (line.partition(":") for line in lines[1:])
               if sep]
    fields = {k.lower(): v for k, v in headers}
    if "chunked" in fields.get("transfer-encoding", "").lower():
        body = await _read_chunked(reader)
    else:
        body = await reader.readexactly(int(fields.get("content-length", "0")))
    return _Request(method, target, headers, body)


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    body = bytearray()
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
        if size == 0:
            await reader.readuntil(b"\r\n")
            return bytes(body)
        body += await reader.readexactly(size)
        await reader.readexactly(2)


async def _write_response(writer: asyncio.StreamWriter, status: int, headers: list[tuple[str, str]],
                          body: bytes) -> None:
    lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}"]
    lines += [f"{k}: {v}" for k, v in headers]
    lines += [f"content-length: {len(body)}", "", ""]
    writer.write("\r\n".join(lines).encode("latin-1") + body)
    await writer.drain()


_REASONS = {200: "OK", 202: "Accepted", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found",
            405: "Method Not Allowed", 502: "Bad Gateway", 503: "Service Unavailable"}


def _seconds(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _describe(body: bytes) -> Exchange:
    try:
        message = json.loads(body) if body else None
    except ValueError:
        message = None
    if not isinstance(message, dict):
        return Exchange(method=None, tool=None, key=None, arguments=None)
    params = message.get("params") or {}
    method = message.get("method")
    if method != "tools/call":
        return Exchange(method=method, tool=None, key=None, arguments=None)
    arguments = params.get("arguments") or {}
    key = (params.get("_meta") or {}).get(META_KEY) or arguments.get("idempotency_key")
    return Exchange(method=method, tool=params.get("name"), key=key, arguments=arguments,
                    meta=params.get("_meta") or {})


def _reply_of(response: httpx2.Response) -> dict[str, Any] | None:
    """The JSON-RPC response in a JSON or SSE body."""
    content_type = response.headers.get("content-type", "")
    try:
        if content_type.startswith("application/json"):
            message = response.json()
            return message if isinstance(message, dict) else None
        if content_type.startswith("text/event-stream"):
            for line in response.text.splitlines():
                if line.startswith("data:"):
                    message = json.loads(line[5:].strip() or "null")
                    if isinstance(message, dict) and ("result" in message or "error" in message):
                        return message
    except ValueError:
        return None
    return None
