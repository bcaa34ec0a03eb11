"""One attempt on the wire: the SDK connection the client owns, and what an attempt came back with.

IdempotentClient (client.py) decides what to send and whether to send it again; this module
turns each attempt's outcome (a tool result, a JSON-RPC error, an HTTP status, a dropped
connection) into an Answer with a class, and says whether the request may have reached the
server (`sent`), which decides whether a lost answer makes the ledger entry UNKNOWN.
"""

from __future__ import annotations

import contextlib
import contextvars
import email.utils
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx2
from mcp import Client
from mcp.client.session import ElicitationFnT
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT, CallToolResult, DiscoverResult, ListToolsResult, Tool
from mcp_types.version import LATEST_MODERN_VERSION

# HTTP answers seen by the current attempt. The SDK sends each request from a task
# that inherits the sender's context, so an attempt sees its own responses' status
# and Retry-After even though the SDK itself reports a 503 only as a generic error.
http_seen: contextvars.ContextVar[list[tuple[int, str | None]] | None] = contextvars.ContextVar(
    "idemops_http_seen", default=None)


async def observe(response: httpx2.Response) -> None:
    seen = http_seen.get()
    if seen is not None:
        seen.append((response.status_code, response.headers.get("retry-after")))


@dataclass
class Answer:
    """What one attempt came back with."""

    error_class: str | None = None
    message: str = ""
    error: dict[str, Any] | None = None
    retry_after: float | None = None
    result: CallToolResult | None = None
    structured: dict[str, Any] = field(default_factory=dict)
    sent: bool = False  # the request may have reached the server
    from_server: bool = False  # the server's tool answered (not the transport)

    @property
    def ok(self) -> bool:
        return self.error_class is None

    @property
    def idempotency(self) -> dict[str, Any]:
        info = self.structured.get("idempotency")
        return info if isinstance(info, dict) else {}


class Dialer:
    """Opens one SDK session per request, so a lost answer costs only its own request.

    Under the 2026-07-28 protocol a session is a stamp on each request, not a connection:
    after the first session discovered the server (`server/discover`), every later one
    adopts that result without a round trip, and a request is one HTTP POST on the shared
    HTTP client's pool. A broken response stream then fails its own request only (one SDK
    session serving every call failed them all together). A server that knows only the
    initialize handshake gets one handshake per session instead.
    """

    def __init__(self, url: str, http: httpx2.AsyncClient, timeout: float, *,
                 elicitation: ElicitationFnT | None = None):
        self.url = url
        self.elicitation = elicitation  # the person's answers to what a tool asks them (MCP elicitation)
        self.http = http
        self.timeout = timeout
        self.discovered: DiscoverResult | None = None
        self.legacy = False
        self.protocol_version: str | None = None
        self.opened = 0  # sessions opened: one per request
        # The SDK session validates a tool's structured result against the listed output schema,
        # listing the tools first if this session has not: the client's listing is handed to each
        # new session instead (the step the SDK's own response cache takes on a hit).
        self.listing: ListToolsResult | None = None
        self._discovering = anyio.Lock()

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[Client]:
        if self.discovered is None and not self.legacy:
            await self._discover()
        mode = "legacy" if self.legacy else (self.protocol_version or LATEST_MODERN_VERSION)
        self.opened += 1
        async with Client(self._transport(), mode=mode, prior_discover=self.discovered,
                          read_timeout_seconds=self.timeout, cache=None,
                          elicitation_callback=self.elicitation) as client:
            absorb = getattr(client.session, "_absorb_tool_listing", None)
            if self.listing is not None and absorb is not None:
                absorb(self.listing.model_copy(deep=True), complete=True)
            yield client

    def _transport(self) -> Any:
        return streamable_http_client(self.url, http_client=self.http)

    async def _discover(self) -> None:
        """One `server/discover`, before the first request (concurrent first requests share it).

        Not the SDK's `mode="auto"`: its fallback handshake would send a refused token twice.
        An HTTP error (401, 503, ...) is the request's failure, raised; a JSON-RPC error from a
        server that knows no discovery means the handshake era, one handshake per session."""
        async with self._discovering:
            if self.discovered is not None or self.legacy:
                return
            seen = http_seen.get()
            before = len(seen) if seen is not None else 0
            async with Client(self._transport(), mode=LATEST_MODERN_VERSION, cache=None,
                              read_timeout_seconds=self.timeout) as probe:
                try:
                    raw = await probe.session.send_discover(LATEST_MODERN_VERSION)
                except MCPError as exc:
                    if exc.code in (CONNECTION_CLOSED, REQUEST_TIMEOUT) or (
                            seen is not None and any(status >= 400 for status, _ in seen[before:])):
                        raise  # the request's own failure (no answer, or an HTTP error), not the server's era
                    self.legacy = True
                    return
            self.discovered = DiscoverResult.model_validate(raw)
            self.protocol_version = LATEST_MODERN_VERSION


def result_text(result: CallToolResult | None) -> str:
    if result is None:
        return ""
    return "\n".join(getattr(block, "text", "") for block in result.content)


def interpret(result: CallToolResult) -> Answer:
    structured = dict(result.structured_content or {})
    if not result.is_error:
        return Answer(result=result, structured=structured, sent=True, from_server=True)
    error = structured.get("error")
    if not isinstance(error, dict) or not isinstance(error.get("class"), str):
        # An isError result without the error object (not an idemops answer): nothing to act on.
        message = result_text(result)[:500] or "the tool answered an error without a class"
        return Answer(error_class="protocol_error", message=message, result=result, structured=structured,
                       error={"class": "protocol_error", "message": message}, sent=True, from_server=True)
    retry_after = error.get("retry_after")
    return Answer(error_class=error["class"], message=str(error.get("message", "")), error=error,
                   retry_after=float(retry_after) if isinstance(retry_after, (int, float)) else None,
                   result=result, structured=structured, sent=True, from_server=True)


def leaf(exc: BaseException) -> BaseException:
    """The first real error inside (nested) exception groups."""
    while isinstance(exc, BaseExceptionGroup):
        inner = [e for e in exc.exceptions if not isinstance(e, anyio.get_cancelled_exc_class())]
        exc = inner[0] if inner else exc.exceptions[0]
    return exc


def failed_attempt(exc: BaseException, seen: list[tuple[int, str | None]], reached: bool) -> Answer:
    """A client-side class for a failed attempt, from the exception and the HTTP statuses it saw.

    `sent` says whether the request may have reached the server's tool: not if the
    connection never opened, not for a 503 (refused, nothing done), not for 401/403/429.
    """
    failed = [(status, retry_after) for status, retry_after in seen if status >= 400]
    if failed:
        status, retry_after = failed[-1]
        if status == 503:
            return client_answer("unavailable", "HTTP 503 from the server", retry_after_seconds(retry_after),
                                 sent=False)
        if status >= 500:
            # A 502/504 from a proxy may come after the server acted.
            return client_answer("unavailable", f"HTTP {status} from the server", retry_after_seconds(retry_after),
                                  sent=reached)
        if status in (401, 403):
            return client_answer("unauthorized", f"HTTP {status}: the token was refused", None)
        if status == 429:
            return client_answer("rate_limited", "HTTP 429", retry_after_seconds(retry_after) or 1.0)
        return client_answer("protocol_error", f"HTTP {status} from the server", None)
    if isinstance(exc, MCPError):
        if exc.code in (CONNECTION_CLOSED, REQUEST_TIMEOUT):
            return client_answer("transport", exc.message, None, sent=reached)
        return client_answer("protocol_error", f"JSON-RPC error {exc.code}: {exc.message}", None)
    if isinstance(exc, (httpx2.TransportError, OSError, TimeoutError, anyio.BrokenResourceError,
                        anyio.ClosedResourceError, anyio.EndOfStream)):
        # A refused connection sent nothing; anything else may have reached the server.
        text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        return client_answer("transport", text, None, sent=reached and not isinstance(exc, httpx2.ConnectError))
    return client_answer("protocol_error", f"{type(exc).__name__}: {exc}", None, sent=reached)


async def list_tools(client: Client) -> ListToolsResult:
    """Every page of tools/list, as one listing."""
    tools: list[Tool] = []
    cursor = None
    while True:
        page = await client.list_tools(cursor=cursor)
        tools += page.tools
        cursor = page.next_cursor
        if cursor is None:
            return ListToolsResult(tools=tools)


def client_answer(error_class: str, message: str, retry_after: float | None, sent: bool = False) -> Answer:
    error: dict[str, Any] = {"class": error_class, "message": message}
    if retry_after is not None:
        error["retry_after"] = retry_after
    return Answer(error_class=error_class, message=message, error=error, retry_after=retry_after, sent=sent)


def retry_after_seconds(header: str | None) -> float | None:
    """Retry-After as seconds (delta-seconds or an HTTP date)."""
    if not header:
        return None
    try:
        return max(0.0, float(header))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(header)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())
