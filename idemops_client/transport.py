"""One attempt on the wire: the SDK connection the client owns, and what an attempt came back with.

IdempotentClient (client.py) decides what to send and whether to send it again; this module
turns each attempt's outcome (a tool result, a JSON-RPC error, an HTTP status, a dropped
connection) into an Answer with a class, and says whether the request may have reached the
server (`sent`), which decides whether a lost answer makes the ledger entry UNKNOWN.
"""

from __future__ import annotations

import contextvars
import email.utils
import time
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT, CallToolResult

from idemops_client.errors import ClientError

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


class Connection:
    """One SDK session, entered and exited by a task of its own.

    The SDK cancels the task that entered a session when its transport fails;
    here that task only waits, so no caller is cancelled: requests in flight
    fail with "connection closed" and the next attempt opens a new session.
    """

    def __init__(self, url: str, http: httpx2.AsyncClient, timeout: float):
        self.url = url
        self.http = http
        self.timeout = timeout
        self.client: Client | None = None
        self.dead = False
        self.failure: BaseException | None = None
        self._ready = anyio.Event()
        self._close = anyio.Event()

    async def start(self, tg: anyio.abc.TaskGroup) -> Client:
        tg.start_soon(self._run)
        await self._ready.wait()
        if self.client is None:
            raise self.failure or ClientError("connection closed before it opened")
        return self.client

    async def _run(self) -> None:
        try:
            async with Client(streamable_http_client(self.url, http_client=self.http), mode="legacy",
                              read_timeout_seconds=self.timeout) as client:
                self.client = client
                self._ready.set()
                await self._close.wait()
        except Exception as exc:  # never into the task group: that would cancel the client's owner
            self.failure = exc
        finally:
            self.dead = True
            self._ready.set()  # a connection that never opened: start() raises its failure

    def close(self) -> None:
        self.dead = True
        self._close.set()


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


async def list_tools(client: Client) -> list[Any]:
    tools, cursor = [], None
    while True:
        page = await client.list_tools(cursor=cursor)
        tools += page.tools
        cursor = page.next_cursor
        if cursor is None:
            return tools


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
