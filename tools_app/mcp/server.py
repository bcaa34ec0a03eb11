"""The MCP endpoint: the official SDK's MCPServer, serving the tool registry at /mcp.

Each registered tool becomes an SDK `Tool` whose input schema is the tool's
pydantic model and whose output schema adds the idempotency envelope; its
`_meta` says whether its key must be an issued operation id and which of its
arguments are not business data. The
handler is thin: authenticate (the SDK's bearer middleware calls our
verifier), hand the raw arguments to `tools_app.toolkit.calls.start_call` in a
database thread, and render the result or error.

Streamable HTTP runs stateless, so any number of web processes can serve it.

Traces: OpenTelemetry's ASGI middleware, outermost, opens a span per HTTP request from its
`traceparent` header (where spans are exported; otherwise only that context is made current:
`tracing.TracedASGI`); the SDK's own OpenTelemetryMiddleware then opens one per MCP message,
parented on `params._meta.traceparent` when the call carries one (MCP SEP-414), else on the
HTTP span. A tool call's spans and records are in that trace (tools_app.core.tracing).

While the database is unreachable (tools_app.core.outage), a tool call
answers `transient` with `retry_after`, another request that needs the
database a JSON-RPC error of that class, and a request whose bearer token
cannot be checked HTTP 503 with Retry-After (`DatabaseGuard`).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.tools.base import Tool
from mcp.server.mcpserver.utilities.func_metadata import ArgModelBase, FuncMetadata
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS, CallToolResult, InputRequiredResult, ToolAnnotations
from pydantic import BaseModel, ConfigDict, create_model
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.types import Receive, Scope, Send

from tools_app.approvals.confirmations import Confirming
from tools_app.conf import conf
from tools_app.core import keys, outage, polling, tracing
from tools_app.core.errors import INTERNAL_ERROR_ADVICE, PERMISSION_DENIED_ADVICE, UNKNOWN_OUTCOME_ADVICE, NotFound
from tools_app.mcp import confirming, conformance_tools
from tools_app.mcp.guards import DatabaseGuard, RequestIdGuard
from tools_app.mcp.idempotency_extension import (
    IDENTIFIER,
    IdempotencyExtension,
    advertise_in_initialize,
    tool_declaration,
)
from tools_app.mcp.runtime import (
    DatabaseUnavailable,
    IdempotencyInfo,
    TenantTokenVerifier,
    admitted,
    caller_limits,
    count_call,
    current_caller,
    in_db_thread,
    render,
)
from tools_app.mcp.task_protocols import task_protocols
from tools_app.mcp.tasks_extension import TasksExtension
from tools_app.toolkit.calls import CallResult, start_call
from tools_app.toolkit.registry import ToolSpec, all_tools, get_tool

# --- SDK tools from registry declarations -----------------------------------------


class _RawArguments(ArgModelBase):
    """Passes the arguments through untouched: tools_app.toolkit.calls validates them,
    so a bad argument is an `invalid_input` error like any other."""

    model_config = ConfigDict(extra="allow")

    def model_dump_one_level(self) -> dict[str, Any]:
        return {"arguments": dict(self.model_extra or {})}


def output_model(spec: ToolSpec) -> type[BaseModel]:
    if not spec.writes:
        return spec.output_model
    return create_model(f"{spec.output_model.__name__}WithIdempotency", __base__=spec.output_model,
                        idempotency=(IdempotencyInfo, ...))


def tool_annotations(spec: ToolSpec) -> ToolAnnotations:
    return ToolAnnotations(
        title=spec.title, read_only_hint=not spec.writes,
        # With the same idempotency key, repeating a write has no further effect.
        idempotent_hint=True, destructive_hint=spec.destructive if spec.writes else False,
        open_world_hint=spec.open_world,
    )


# What a client needs to know about a write tool to key it: the extension's declaration (its section 3),
# and the two flat keys clients read before the extension was advertised.
REQUIRES_OPERATION_ID_META = "io.idemops/requires-operation-id"
NON_BUSINESS_META = "io.idemops/non-business-fields"


def tool_meta(spec: ToolSpec) -> dict[str, Any] | None:
    meta: dict[str, Any] = {}
    if (declaration := tool_declaration(spec)) is not None:
        meta[IDENTIFIER] = declaration
    if spec.requires_operation_id:
        meta[REQUIRES_OPERATION_ID_META] = True
    if spec.non_business_fields:
        meta[NON_BUSINESS_META] = sorted(spec.non_business_fields)
    return meta or None


def sdk_tool(spec: ToolSpec) -> Tool:
    async def handle(arguments: dict[str, Any], ctx: Context) -> CallToolResult | InputRequiredResult:
        started = time.perf_counter()
        caller = current_caller(ctx)
        limits = caller_limits()
        # _meta is the client's JSON: a key that is not a string is refused by keys.validate_key.
        meta: Mapping[str, Any] = ctx.request_context.meta or {}
        # A tool whose person confirms it first (tools_app.mcp.confirming): the host and its answer, if any.
        asking = confirming.confirming(ctx) if spec.confirmation is not None and conf().mcp_user_confirmation \
            else None

        async def call(asking: Confirming | None) -> CallResult:
            try:
                # A call that waits (a follower, a task wait) answers a handle on its wait, awaited here
                # holding no database thread, then goes on from there (core.polling).
                return await polling.settle_async(in_db_thread, lambda: admitted(spec, limits, lambda: start_call(
                    spec, caller, arguments, meta_key=meta.get(keys.META_KEY), confirming=asking)))
            except DatabaseUnavailable:
                # Whatever the call did is either committed with its record or not at
                # all, and the engine runs the key at most once: the same key may retry.
                return CallResult(spec, error=outage.transient())

        result = await call(asking)
        asked = confirming.question(result.error) if asking is not None and result.error is not None else None
        if asking is not None and asked is not None and confirming.can_elicit_form(ctx):
            if confirming.modern(ctx):
                count_call(caller, spec.name, result, started)
                return confirming.input_required(asked)
            if ctx.session.can_send_request:  # a stateful session at 2025-11-25
                answer = await confirming.elicit(ctx, asked)
                if answer is not None:
                    result = await call(Confirming(host=asking.host, answer=answer))
        count_call(caller, spec.name, result, started)
        return render(confirming.with_page_link(result))

    out = output_model(spec)
    return Tool(
        fn=handle, name=spec.name, title=spec.title, description=spec.description,
        parameters=spec.input_model.model_json_schema(), is_async=True, context_kwarg="ctx",
        fn_metadata=FuncMetadata(arg_model=_RawArguments, output_model=out),
        annotations=tool_annotations(spec), meta=tool_meta(spec),
    )


class IdemopsServer(MCPServer):
    # Tools served besides the registry's: the conformance suite's test-only ones, with their setting on.
    plain_tools: frozenset[str] = frozenset()

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Context | None = None
                        ) -> CallToolResult | InputRequiredResult:
        # The MCP spec makes an unknown tool a protocol error (-32602), not a tool result (the SDK
        # answers one with unclassified text); its data carries our error class.
        try:
            if name not in self.plain_tools:
                get_tool(name)
        except NotFound as unknown:
            raise MCPError(code=INVALID_PARAMS, message=f"Unknown tool: {name}", data=unknown.as_dict()) from None
        return await super().call_tool(name, arguments, context)


def build_server() -> MCPServer:
    public_url = conf().public_url.rstrip("/")
    tools = [sdk_tool(spec) for spec in all_tools()]
    if conf().conformance_test_tools:
        tools += conformance_tools.tools()
    server = IdemopsServer(
        name="idemops",
        instructions="Write tools need an idempotency_key: reuse it on every retry of one operation, and use a "
                     "new key only for a new operation. Errors carry a class: retry `transient` after "
                     "retry_after with the same key; `in_progress` and `pending_approval`: ask again with the "
                     f"same key; `unknown_outcome`: {UNKNOWN_OUTCOME_ADVICE}; `conflict`: the key was used with "
                     "other arguments (a new operation needs a new key); `downstream_conflict`: the downstream "
                     "system holds the key for another request, so neither retry it nor pick a new key: an "
                     f"operator must check; `permission_denied`: {PERMISSION_DENIED_ADVICE}; `internal_error`: a "
                     f"fault of the server, {INTERNAL_ERROR_ADVICE} (error.reference). High-risk tools "
                     "(_meta io.idemops/requires-operation-id) take as their "
                     "key only an operation_id from prepare_operation; get_operation answers what became of an "
                     "operation.",
        tools=tools,
        extensions=[TasksExtension(), IdempotencyExtension()],
        # Request state (2026-07-28's input-required rounds: a confirmation) sealed under keys every web
        # process shares, so any process takes the host's answer (tools_app.mcp.confirming).
        request_state_security=confirming.request_state_security(),
        middleware=[task_protocols, advertise_in_initialize],
        token_verifier=TenantTokenVerifier(f"{public_url}/mcp"),
        # This server is its own authorization server (django-oauth-toolkit, docs/auth.md); the SDK names its
        # protected-resource metadata in a 401 and refuses a token issued for another resource (RFC 8707).
        # Scopes are checked per tool (guards.required_scope), so none is required of every request.
        # Validated from strings, so the model's url_preserve_empty_path keeps the issuer's canonical form.
        auth=AuthSettings.model_validate({"issuer_url": public_url, "resource_server_url": f"{public_url}/mcp",
                                          "required_scopes": [], "validate_token_resource": True}),
    )
    if conf().conformance_test_tools:
        server.plain_tools = conformance_tools.NAMES
        conformance_tools.serve_logging_level(server)
    return server


# Stateful Streamable HTTP, for hosts at 2025-11-25 whose tools ask their person mid-call (elicitation/create:
# a confirmation). A session lives in the process that opened it: the load balancer routes by Mcp-Session-Id.
SESSION_PATH = "/mcp/session"


def _served(server: MCPServer, path: str, *, stateless: bool) -> Starlette:
    app = server.streamable_http_app(
        streamable_http_path=path,
        stateless_http=stateless,
        max_request_body_size=conf().mcp_max_request_bytes,
        transport_security=TransportSecuritySettings(
            allowed_hosts=conf().mcp_allowed_hosts,
            allowed_origins=conf().mcp_allowed_origins,
        ),
    )
    app.add_middleware(DatabaseGuard)  # outermost of the app's middleware: around the bearer-token check
    # Innermost, after the SDK's authentication middleware (see guards.RequestIdGuard).
    app.user_middleware.append(Middleware(RequestIdGuard, max_body_size=conf().mcp_max_request_bytes))
    return app


def build_app() -> tracing.TracedASGI:
    """The ASGI app serving /mcp (stateless) and /mcp/session (stateful); its lifespan runs both session
    managers."""
    app = _served(build_server(), "/mcp", stateless=True)
    sessions_server = build_server()
    sessions = _served(sessions_server, SESSION_PATH, stateless=False)
    own_lifespan = app.router.lifespan_context

    @asynccontextmanager
    async def both(starlette: Starlette) -> AsyncIterator[Any]:
        async with own_lifespan(starlette) as state, sessions_server.session_manager.run():
            yield state

    app.router.lifespan_context = both

    async def route(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("path", "").rstrip("/") == SESSION_PATH:
            await sessions(scope, receive, send)
        else:
            await app(scope, receive, send)

    # Around everything: the HTTP request's span, from its traceparent header (lifespan passes through).
    return tracing.TracedASGI(route)
