"""The MCP endpoint: the official SDK's MCPServer, serving the tool registry at /mcp.

Each registered tool becomes an SDK `Tool` whose input schema is the tool's
pydantic model and whose output schema adds the idempotency envelope. The
handler is thin: authenticate (the SDK's bearer middleware calls our
verifier), hand the raw arguments to `tools_app.calls.call_tool` in a
database thread, and render the result or error.

Streamable HTTP runs stateless, so any number of web processes can serve it.

While the database is unreachable (tools_app.unavailable), a tool call
answers `transient` with `retry_after`, another request that needs the
database a JSON-RPC error of that class, and a request whose bearer token
cannot be checked HTTP 503 with Retry-After (`DatabaseGuard`).
"""

from __future__ import annotations

import functools
import json
import time
from typing import Any

import anyio
from django.conf import settings
from django.db import close_old_connections
from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.tools.base import Tool
from mcp.server.mcpserver.utilities.func_metadata import ArgModelBase, FuncMetadata
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS, CallToolResult, TextContent, ToolAnnotations
from pydantic import BaseModel, ConfigDict, Field, create_model
from starlette.middleware import Middleware

from tools_app import idempotency, metrics, tenants, unavailable
from tools_app.calls import Caller, CallResult, call_tool
from tools_app.errors import UNKNOWN_OUTCOME_ADVICE, NotFound
from tools_app.mcp_guard import RequestIdGuard
from tools_app.registry import ToolSpec, all_tools, get_tool

REPLAYED_META = "io.idemops/replayed"
EXPIRES_META = "io.idemops/expires-at"
# JSON-RPC's range for implementation-defined server errors.
DATABASE_UNAVAILABLE_CODE = -32000


# --- running ORM code from async handlers ---------------------------------------

_db_limiter: anyio.CapacityLimiter | None = None


class DatabaseUnavailable(MCPError):
    """The database could not be reached: a JSON-RPC error of class `transient`, with `retry_after`."""

    def __init__(self):
        super().__init__(DATABASE_UNAVAILABLE_CODE, unavailable.MESSAGE, data=unavailable.error_body())


async def in_db_thread(fn, /, *args, **kwargs):
    """Run sync ORM code in a worker thread (not Django's single shared thread)."""
    global _db_limiter
    if _db_limiter is None:
        _db_limiter = anyio.CapacityLimiter(settings.IDEMOPS["MCP_DB_THREADS"])
    try:
        return await anyio.to_thread.run_sync(functools.partial(_with_fresh_connection, fn, *args, **kwargs),
                                              limiter=_db_limiter)
    except unavailable.DATABASE_ERRORS as exc:
        unavailable.log(getattr(fn, "__qualname__", "mcp"), exc)
        raise DatabaseUnavailable() from exc


def _with_fresh_connection(fn, *args, **kwargs):
    # Threads are pooled and keep their persistent connection; drop it if it
    # broke or aged out, as Django does around each HTTP request.
    close_old_connections()
    try:
        return fn(*args, **kwargs)
    finally:
        close_old_connections()


# --- authentication ---------------------------------------------------------------


class TenantTokenVerifier:
    """Maps `Authorization: Bearer <token>` to the tenant and agent identity."""

    async def verify_token(self, token: str) -> AccessToken | None:
        api_token = await in_db_thread(tenants.authenticate_token, token)
        if api_token is None:
            return None
        return AccessToken(
            token=token, client_id=api_token.agent_identity, scopes=["tools"],
            claims={"tenant_id": api_token.tenant_id, "token_id": api_token.pk},
        )


def authenticated_caller() -> Caller:
    """The tenant and agent of the verified bearer token (the SDK's middleware ran first)."""
    access = get_access_token()
    if access is None or not access.claims:  # a guard: /mcp never runs a tool unauthenticated
        raise PermissionError("no authenticated tenant")
    return Caller(tenant_id=access.claims["tenant_id"], actor=access.client_id)


def current_caller(ctx: Context) -> Caller:
    """The caller, able to send progress notifications on this request."""
    caller = authenticated_caller()

    def report_progress(done: float, total: float | None = None, message: str | None = None) -> None:
        # Called from the database thread; the notification is sent on the event loop.
        anyio.from_thread.run(ctx.report_progress, done, total, message)

    return Caller(tenant_id=caller.tenant_id, actor=caller.actor, report_progress=report_progress)


# --- results ----------------------------------------------------------------------


class IdempotencyInfo(BaseModel):
    """Attached to every write tool response."""

    status: str = Field(description="SUCCEEDED, FAILED, PROCESSING, UNKNOWN or AWAITING_APPROVAL")
    replayed: bool = Field(description="True when this is the stored result of an earlier call with the key")
    expires_at: str | None = Field(description="When this key's record may be reused or reviewed")
    operation_id: str | None = None


def idempotency_info(result: CallResult) -> dict[str, Any] | None:
    record = result.record
    if record is None:
        return None
    return IdempotencyInfo(status=record.status, replayed=result.replayed,
                           expires_at=record.expires_at.isoformat(),
                           operation_id=str(record.operation_id)).model_dump()


def render(result: CallResult) -> CallToolResult:
    info = idempotency_info(result)
    if result.error is not None:
        structured: dict[str, Any] = {"error": result.error.as_dict()}
        text = f"{result.error.error_class}: {result.error.message}"
    else:
        structured = dict(result.result or {})
        text = None
    if info is not None:
        structured["idempotency"] = info
    # Sorted keys: PostgreSQL's jsonb does not keep key order, and a replay
    # must read exactly like the first answer.
    body = json.dumps(structured, ensure_ascii=False, sort_keys=True)
    structured = json.loads(body)
    meta = {REPLAYED_META: result.replayed, EXPIRES_META: info["expires_at"]} if info else None
    return CallToolResult(
        content=[TextContent(type="text", text=f"{text}\n{body}" if text else body)],
        structured_content=structured, is_error=result.error is not None, _meta=meta,
    )


def count_call(caller: Caller, tool: str, result: CallResult, started: float) -> None:
    """One CallEvent for the dashboard (batched; see tools_app.metrics)."""
    metrics.record_call(tenant_id=caller.tenant_id, tool=tool, outcome=result.outcome,
                        error_class=result.error.error_class if result.error else "",
                        latency_ms=(time.perf_counter() - started) * 1000)


# --- SDK tools from registry declarations -----------------------------------------


class _RawArguments(ArgModelBase):
    """Passes the arguments through untouched: tools_app.calls validates them,
    so a bad argument is an `invalid_input` error like any other."""

    model_config = ConfigDict(extra="allow")

    def model_dump_one_level(self) -> dict[str, Any]:
        return {"arguments": dict(self.model_extra or {})}


def output_model(spec: ToolSpec) -> type[BaseModel]:
    if not spec.writes:
        return spec.output_model
    return create_model(f"{spec.output_model.__name__}WithIdempotency", __base__=spec.output_model,
                        idempotency=(IdempotencyInfo, ...))


def annotations(spec: ToolSpec) -> ToolAnnotations:
    return ToolAnnotations(
        title=spec.title, read_only_hint=not spec.writes,
        # With the same idempotency key, repeating a write has no further effect.
        idempotent_hint=True, destructive_hint=spec.destructive if spec.writes else False,
        open_world_hint=spec.open_world,
    )


def sdk_tool(spec: ToolSpec) -> Tool:
    async def handle(arguments: dict[str, Any], ctx: Context) -> CallToolResult:
        started = time.perf_counter()
        caller = current_caller(ctx)
        meta = ctx.request_context.meta or {}
        try:
            result = await in_db_thread(call_tool, spec, caller, arguments, meta_key=meta.get(idempotency.META_KEY))
        except DatabaseUnavailable:
            # Whatever the call did is either committed with its record or not at
            # all, and the engine runs the key at most once: the same key may retry.
            result = CallResult(spec, error=unavailable.transient())
        count_call(caller, spec.name, result, started)
        return render(result)

    out = output_model(spec)
    return Tool(
        fn=handle, name=spec.name, title=spec.title, description=spec.description,
        parameters=spec.input_model.model_json_schema(), is_async=True, context_kwarg="ctx",
        fn_metadata=FuncMetadata(arg_model=_RawArguments, output_model=out),
        annotations=annotations(spec),
    )


class IdemopsServer(MCPServer):
    async def call_tool(self, name: str, arguments: dict[str, Any], context: Context | None = None):
        # The MCP spec makes an unknown tool a protocol error (-32602), not a tool result (the SDK
        # answers one with unclassified text); its data carries our error class.
        try:
            get_tool(name)
        except NotFound as unknown:
            raise MCPError(code=INVALID_PARAMS, message=f"Unknown tool: {name}", data=unknown.as_dict()) from None
        return await super().call_tool(name, arguments, context)


def build_server() -> MCPServer:
    from tools_app.mcp_tasks import TasksExtension  # it builds on this module

    public_url = settings.IDEMOPS["PUBLIC_URL"].rstrip("/")
    return IdemopsServer(
        name="idemops",
        instructions="Write tools need an idempotency_key: reuse it on every retry of one operation, and use a "
                     "new key only for a new operation. Errors carry a class: retry `transient` after "
                     "retry_after with the same key; `in_progress` and `pending_approval`: ask again with the "
                     f"same key; `unknown_outcome`: {UNKNOWN_OUTCOME_ADVICE}; `conflict`: the key was used with "
                     "other arguments (a new operation needs a new key); `downstream_conflict`: the downstream "
                     "system holds the key for another request, so neither retry it nor pick a new key: an "
                     "operator must check.",
        tools=[sdk_tool(spec) for spec in all_tools()],
        extensions=[TasksExtension()],
        token_verifier=TenantTokenVerifier(),
        # Our tokens are opaque per-tenant API keys, not audience-bound JWTs.
        auth=AuthSettings(issuer_url=public_url, resource_server_url=f"{public_url}/mcp", required_scopes=["tools"],
                          validate_token_resource=False),
    )


class DatabaseGuard:
    """ASGI middleware around the SDK's /mcp app: a database error before the response
    started (the bearer-token lookup) becomes HTTP 503 with Retry-After and a JSON-RPC error.

    It sits inside Starlette's error middleware, which would answer a plain-text
    500 "Internal Server Error"; the SDK's client reads a JSON-RPC error at a
    non-2xx status as that error (data.class = "transient").
    """

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def tracked_send(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked_send)
        except (DatabaseUnavailable, *unavailable.DATABASE_ERRORS) as exc:
            if started:
                raise
            if not isinstance(exc, DatabaseUnavailable):
                unavailable.log(scope.get("path", "/mcp"), exc)
            # The request's id may not have been read yet: JSON-RPC's null id.
            body = json.dumps({"jsonrpc": "2.0", "id": None, "error": DatabaseUnavailable().error.model_dump()})
            await send({"type": "http.response.start", "status": 503, "headers": [
                (b"content-type", b"application/json"), (b"retry-after", unavailable.retry_after_header().encode())]})
            await send({"type": "http.response.body", "body": body.encode()})


def build_app():
    """The Starlette app serving /mcp (its lifespan runs the session manager)."""
    app = build_server().streamable_http_app(
        streamable_http_path="/mcp",
        stateless_http=True,
        max_request_body_size=settings.IDEMOPS["MCP_MAX_REQUEST_BYTES"],
        transport_security=TransportSecuritySettings(
            allowed_hosts=settings.IDEMOPS["MCP_ALLOWED_HOSTS"],
            allowed_origins=settings.IDEMOPS["MCP_ALLOWED_ORIGINS"],
        ),
    )
    app.add_middleware(DatabaseGuard)  # outermost of the app's middleware: around the bearer-token check
    # Innermost, after the SDK's authentication middleware (see tools_app.mcp_guard).
    app.user_middleware.append(Middleware(RequestIdGuard, max_body_size=settings.IDEMOPS["MCP_MAX_REQUEST_BYTES"]))
    return app
