"""Checks of a request's JSON-RPC envelope in front of the MCP SDK's Streamable HTTP transport: its id,
and whether the bearer token's scopes cover what it asks for.

A tools/call needs the tool's scope (`required_scope`: read, write or long), a method of the tasks
extension (tasks/get, update, cancel, result, list) `long`: a static API token has all three, an
OAuth token those its person granted. Without it the answer is HTTP 403 with
`WWW-Authenticate: Bearer error="insufficient_scope", scope=...` and the protected-resource
metadata URL, as the MCP authorization spec asks, and nothing runs.

JSON-RPC 2.0 says a request's `id` is a string, a number or null; MCP narrows
it to a string or an integer. The SDK (mcp 2.3, protocol versions up to
2025-11-25) reads a message whose id is anything else (an object, a list,
true, null, 1.5) as a *notification*, because its notification model ignores
unknown members, and answers 202 Accepted: the client waits for an answer
that never comes. This middleware answers such a message as JSON-RPC
prescribes: HTTP 400 with the error -32600 Invalid Request and a null id,
its `data` carrying our error class.

It runs after authentication (an unauthenticated caller still gets 401, and
no body is read for it) and within the SDK's request-body limit.
"""

from __future__ import annotations

import json
from typing import Any

import pydantic_core
from mcp.server.auth.routes import build_resource_metadata_url
from mcp.server.transport_security import RequestBodyLimitMiddleware
from mcp_types import INVALID_REQUEST, ErrorData, JSONRPCError
from pydantic import AnyHttpUrl
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tools_app.access import oauth
from tools_app.conf import conf
from tools_app.core import outage
from tools_app.core.errors import InvalidInput, NotFound
from tools_app.mcp.runtime import DatabaseUnavailable
from tools_app.toolkit.registry import ToolSpec, get_tool
from tools_app.tools.task_tools import TASK_WRITE_TOOLS


def bad_request_id(body: bytes) -> InvalidInput | None:
    """The error for a request whose id is neither a string nor an integer; None for anything else
    (the SDK answers unparseable bodies, batches and other mistakes itself)."""
    try:
        message: Any = pydantic_core.from_json(body)
    except ValueError:
        return None
    if not isinstance(message, dict) or "method" not in message or "id" not in message:
        return None
    request_id = message["id"]
    if isinstance(request_id, str) or (isinstance(request_id, int) and not isinstance(request_id, bool)):
        return None
    return InvalidInput("id: a request's id must be a string or an integer (a message without an id is a "
                        "notification)")


def required_scope(spec: ToolSpec) -> str:
    """The OAuth scope a tool needs: `read` for read-only tools, `long` for long tools and the tools that start
    or steer tasks, `write` for every other write."""
    if not spec.writes:
        return oauth.READ
    if spec.pipeline is not None or spec.name in TASK_WRITE_TOOLS:
        return oauth.LONG
    return oauth.WRITE


def missing_scope(body: bytes, scope: Scope) -> str | None:
    """The scope a request needs and the bearer token lacks (None: it has it, or the request needs none): a
    tools/call the tool's, the tasks extension's methods (tasks/get, update, cancel, result, list) `long`, as
    the long tools whose runs they follow and steer."""
    try:
        message: Any = pydantic_core.from_json(body)
    except ValueError:
        return None
    if not isinstance(message, dict) or not isinstance(message.get("method"), str):
        return None
    method = message["method"]
    if method.startswith("tasks/"):
        needed: str | None = oauth.LONG
    elif method == "tools/call":
        params = message.get("params")
        name = params.get("name") if isinstance(params, dict) else None
        try:
            spec = get_tool(name) if isinstance(name, str) else None
        except NotFound:
            return None  # answered as an unknown tool
        needed = required_scope(spec) if spec is not None else None
    else:
        return None
    credentials = scope.get("auth")
    if needed is None or (credentials is not None and needed in credentials.scopes):
        return None
    return needed


def insufficient_scope(needed: str) -> Response:
    """403 with the challenge the MCP authorization spec describes: the client may ask its person for more."""
    challenge = (f'Bearer error="insufficient_scope", scope="{needed}", resource_metadata="{resource_metadata_url()}", '
                 f'error_description="this tool needs the {needed} scope"')
    return Response(json.dumps({"error": "insufficient_scope", "error_description": f"this tool needs the {needed} "
                                "scope"}), status_code=403, media_type="application/json",
                    headers={"WWW-Authenticate": challenge})


def resource_metadata_url() -> str:
    return str(build_resource_metadata_url(AnyHttpUrl(f"{conf().public_url.rstrip('/')}/mcp")))


class RequestIdGuard:
    def __init__(self, app: ASGIApp, max_body_size: int):
        self.app = app
        self._checked = RequestBodyLimitMiddleware(self._check, max_body_size)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        user = scope.get("user") if scope["type"] == "http" else None
        if scope["type"] != "http" or scope["method"] != "POST" or not getattr(user, "is_authenticated", False):
            await self.app(scope, receive, send)
            return
        await self._checked(scope, receive, send)

    async def _check(self, scope: Scope, receive: Receive, send: Send) -> None:
        # The body-limit middleware has buffered the body: it arrives whole, then is replayed.
        received: list[Message] = []
        body = b""
        while True:
            message = await receive()
            received.append(message)
            if message["type"] != "http.request":
                break
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        missing = missing_scope(body, scope)
        if missing is not None:
            await insufficient_scope(missing)(scope, receive, send)
            return
        problem = bad_request_id(body)
        if problem is not None:
            error = JSONRPCError(jsonrpc="2.0", id=None, error=ErrorData(
                code=INVALID_REQUEST, message=f"Invalid Request: {problem.message}", data=problem.as_dict()))
            response = Response(error.model_dump_json(by_alias=True), status_code=400,
                                media_type="application/json")
            await response(scope, receive, send)
            return

        async def replay() -> Message:
            return received.pop(0) if received else await receive()

        await self.app(scope, replay, send)


class DatabaseGuard:
    """ASGI middleware around the SDK's /mcp app: a database error before the response
    started (the bearer-token lookup) becomes HTTP 503 with Retry-After and a JSON-RPC error.

    It sits inside Starlette's error middleware, which would answer a plain-text
    500 "Internal Server Error"; the SDK's client reads a JSON-RPC error at a
    non-2xx status as that error (data.class = "transient").
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def tracked_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked_send)
        except (DatabaseUnavailable, *outage.DATABASE_ERRORS) as exc:
            if started:
                raise
            if not isinstance(exc, DatabaseUnavailable):
                outage.log(scope.get("path", "/mcp"), exc)
            # The request's id may not have been read yet: JSON-RPC's null id.
            body = json.dumps({"jsonrpc": "2.0", "id": None, "error": DatabaseUnavailable().error.model_dump()})
            await send({"type": "http.response.start", "status": 503, "headers": [
                (b"content-type", b"application/json"), (b"retry-after", outage.retry_after_header().encode())]})
            await send({"type": "http.response.body", "body": body.encode()})
