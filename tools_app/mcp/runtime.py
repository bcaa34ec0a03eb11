"""What every MCP handler shares: ORM work in a database thread, the caller behind the bearer
token, rendering a call's result or error, and counting and logging the call.

A tool handler (server.py) and the tasks extension's methods (tasks_extension.py) both build on
this module; neither imports the other.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

import anyio
from django.db import close_old_connections
from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import AccessToken
from mcp.server.mcpserver import Context
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolResult, TextContent
from pydantic import BaseModel, Field

from tools_app import access, engine
from tools_app.access import oauth
from tools_app.conf import conf
from tools_app.core import counters, keys, logs, outage
from tools_app.core.errors import RateLimited
from tools_app.toolkit.calls import Caller, CallResult
from tools_app.toolkit.registry import ToolSpec

REPLAYED_META = "io.idemops/replayed"


EXPIRES_META = "io.idemops/expires-at"


# JSON-RPC's range for implementation-defined server errors.
DATABASE_UNAVAILABLE_CODE = -32000


_db_limiter: anyio.CapacityLimiter | None = None

P = ParamSpec("P")
T = TypeVar("T")


class DatabaseUnavailable(MCPError):
    """The database could not be reached: a JSON-RPC error of class `transient`, with `retry_after`."""

    def __init__(self) -> None:
        super().__init__(DATABASE_UNAVAILABLE_CODE, outage.MESSAGE, data=outage.error_body())


async def in_db_thread(fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """Run sync ORM code in a worker thread (not Django's single shared thread)."""
    global _db_limiter
    if _db_limiter is None:
        _db_limiter = anyio.CapacityLimiter(conf().mcp_db_threads)
    try:
        return await anyio.to_thread.run_sync(functools.partial(_with_fresh_connection, fn, *args, **kwargs),
                                              limiter=_db_limiter)
    except outage.DATABASE_ERRORS as exc:
        outage.log(getattr(fn, "__qualname__", "mcp"), exc)
        raise DatabaseUnavailable() from exc


def _with_fresh_connection(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    # Threads are pooled and keep their persistent connection; drop it if it
    # broke or aged out, as Django does around each HTTP request.
    close_old_connections()
    try:
        return fn(*args, **kwargs)
    finally:
        close_old_connections()


class TenantTokenVerifier:
    """Maps `Authorization: Bearer <token>` to the tenant and agent identity, its scopes and limits: a static
    API token (every scope), or an OAuth access token (the scopes its person granted, on the connection's
    tenant). The SDK then checks the token's resource is this server's /mcp (RFC 8707 audience)."""

    def __init__(self, resource: str) -> None:
        self.resource = resource

    async def verify_token(self, token: str) -> AccessToken | None:
        if token.startswith(access.TOKEN_PREFIX):
            # A token verified moments ago needs neither a query nor the hop to a database thread.
            api_token = access.cached_token(token) or await in_db_thread(access.authenticate_token, token)
            if api_token is None:
                return None
            return AccessToken(
                token=token, client_id=api_token.agent_identity, scopes=list(oauth.SCOPES), resource=self.resource,
                claims={"tenant_id": api_token.tenant_id, "token_id": api_token.pk,
                        "limits": access.call_limits(api_token).as_claims()},
            )
        found = await in_db_thread(oauth.authenticate, token)
        if found is None:
            return None
        oauth_token, connection = found
        # The token's resource as issued: the SDK refuses it unless it is this server's (a token for another).
        resource = self.resource if self.resource in oauth_token.resource else next(iter(oauth_token.resource), None)
        return AccessToken(
            token=token, client_id=connection.agent_identity, scopes=oauth_token.scope.split(), resource=resource,
            expires_at=int(oauth_token.expires.timestamp()),
            claims={"tenant_id": connection.tenant_id, "oauth_token_id": oauth_token.pk,
                    "limits": access.oauth_call_limits(connection).as_claims()},
        )


def _verified_claims() -> tuple[str, dict[str, Any]]:
    """The client id and claims of the verified bearer token (the SDK's middleware ran first)."""
    verified = get_access_token()
    if verified is None or not verified.claims:  # a guard: /mcp never runs a tool unauthenticated
        raise PermissionError("no authenticated tenant")
    return verified.client_id, verified.claims


def authenticated_caller() -> Caller:
    """The tenant and agent of the verified bearer token."""
    client_id, claims = _verified_claims()
    return Caller(tenant_id=claims["tenant_id"], actor=client_id)


def caller_limits() -> access.CallLimits:
    """The rate limits of the verified bearer token."""
    return access.CallLimits.from_claims(_verified_claims()[1]["limits"])


def admitted(spec: ToolSpec, limits: access.CallLimits, call: Callable[[], T]) -> T | CallResult:
    """`call()`, once the caller's rate limits admit it (else a `rate_limited` result, nothing done)."""
    try:
        access.admit_call(limits)
    except RateLimited as limited:
        return CallResult(spec, error=limited)
    return call()


def current_caller(ctx: Context) -> Caller:
    """The caller, able to send progress notifications on this request."""
    caller = authenticated_caller()

    def report_progress(done: float, total: float | None = None, message: str | None = None) -> None:
        # Called from the database thread; the notification is sent on the event loop.
        anyio.from_thread.run(ctx.report_progress, done, total, message)

    return Caller(tenant_id=caller.tenant_id, actor=caller.actor, report_progress=report_progress)


class IdempotencyInfo(BaseModel):
    """Attached to every write tool response."""

    status: str = Field(description="succeeded, failed, processing, unknown or awaiting_approval")
    replayed: bool = Field(description="True when this is the stored result of an earlier call with the key")
    expires_at: str | None = Field(description="When this key's record may be reused or reviewed; null while the "
                                               "task it started is unfinished (the key answers that task until then)")
    operation_id: str | None = None


def idempotency_info(result: CallResult) -> dict[str, Any] | None:
    record = result.record
    if record is None:
        return None
    ends = engine.retention_ends_at(record)
    return IdempotencyInfo(status=record.status, replayed=result.replayed,
                           expires_at=ends.isoformat() if ends is not None else None,
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
    """The call's count and duration (`idemops_tool_calls_total`, `idemops_tool_call_seconds`: batched,
    see core.counters) and its one log line, in the call's trace."""
    seconds = time.perf_counter() - started
    outcome = result.outcome
    counters.observe(counters.TOOL_CALL, seconds, tool=tool, tenant_id=caller.tenant_id, label=outcome)
    record = result.record
    level = "warning" if outcome in ("unknown", "failed") else "info"
    getattr(logs.get(__name__), level)(
        "tool.call", tenant_id=caller.tenant_id, actor=caller.actor, tool=tool, outcome=outcome,
        duration_ms=round(seconds * 1000, 3), error_class=result.error.error_class if result.error else None,
        replayed=result.replayed if record is not None else None,
        operation_id=str(record.operation_id) if record is not None else None,
        key_digest=keys.key_digest(record.key) if record is not None else None,
        record_status=record.status if record is not None else None)
