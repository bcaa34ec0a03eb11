"""What the SDK has no hook for in MCP tasks: a middleware (it sees each request before the SDK
validates it, and may answer it itself).

At protocol 2025-11-25 (the TypeScript SDK 1.x and the clients built on it):
- `initialize` declares the `tasks` capability (list, cancel, task-augmented
  tools/call);
- `tools/list` marks the long tools `execution.taskSupport: "optional"`;
- `tools/call` with a `task` parameter starts the long tool's task (the same
  start_task operation as every other door: same key, same task) and answers
  `{"task": Task}` at once. Its `ttl` (milliseconds) asks for a shorter
  deadline than the tool's (a longer one gets the tool's); the Task's `ttl`
  says what it got. The SDK cannot: it checks a tools/call answer
  against the CallToolResult of that version. `task` on any other tool is
  -32601, as the spec asks.

At protocol 2026-07-28: `subscriptions/listen` naming `notifications.taskIds`
(the tasks extension's subscription, SEP-2663) is answered here with a stream
that pushes `notifications/tasks` (the task as tasks/get shows it) each time
one of those tasks changes; it ends when all of them are done, or after
IDEMOPS_TASK_LISTEN_MAX_SECONDS. The SDK's own listen handler would drop
`taskIds`. Such a listen serves tasks only: its acknowledgement lists the
task ids honoured (the caller's own tasks) and nothing else.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from contextlib import aclosing
from datetime import timedelta
from typing import Any

from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.mcpserver.server import require_client_extension
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import SUBSCRIPTION_ID_META_KEY
from mcp_types import (
    INVALID_PARAMS,
    METHOD_NOT_FOUND,
    SubscriptionFilter,
    SubscriptionsAcknowledgedNotification,
    SubscriptionsAcknowledgedNotificationParams,
)

from tools_app.conf import conf
from tools_app.core import keys
from tools_app.core.errors import NotFound
from tools_app.mcp import task_watch
from tools_app.mcp.runtime import authenticated_caller, caller_limits, count_call, in_db_thread, render
from tools_app.mcp.tasks_extension import (
    EXTENSION,
    LEGACY,
    MODERN,
    Raw,
    detailed_task,
    legacy_task,
    start_task_for,
)
from tools_app.tasks import agent_view
from tools_app.tasks.models import Task
from tools_app.toolkit.calls import Caller
from tools_app.toolkit.registry import get_tool

TASKS_CAPABILITY: dict[str, Any] = {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}
IMMEDIATE_RESPONSE = "io.modelcontextprotocol/model-immediate-response"
# A requested task.ttl beyond this (about 285,000 years) is taken as this: a timedelta must hold it.
MAX_TTL_MS = 2**53
# One listen follows at most this many tasks.
MAX_LISTEN_TASKS = 100


async def task_protocols(ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
    params = ctx.params or {}
    if ctx.method == "tools/call" and ctx.protocol_version == LEGACY and params.get("task") is not None:
        return await _call_as_task(ctx, params)
    if (ctx.method == "subscriptions/listen" and ctx.protocol_version == MODERN
            and isinstance(params.get("notifications"), dict) and "taskIds" in params["notifications"]):
        return await _listen(ctx, params["notifications"]["taskIds"])
    result = await call_next(ctx)
    # initialize: the request carries no version header yet; the answer says what was agreed.
    if ctx.method == "initialize" and isinstance(result, dict) and result.get("protocolVersion") == LEGACY:
        result.setdefault("capabilities", {})["tasks"] = TASKS_CAPABILITY
    elif ctx.method == "tools/list" and ctx.protocol_version == LEGACY and isinstance(result, dict):
        long_tools = set(agent_view.long_tools())
        for tool in result.get("tools", []):
            if tool.get("name") in long_tools:
                tool["execution"] = {"taskSupport": "optional"}
    return result


# --- 2025-11-25: tools/call with `task` ---------------------------------------------------------------


async def _call_as_task(ctx: ServerRequestContext[Any, Any], params: Mapping[str, Any]) -> dict[str, Any]:
    name, arguments, task = params.get("name"), params.get("arguments") or {}, params.get("task")
    if not isinstance(name, str):
        raise MCPError(code=INVALID_PARAMS, message="Invalid request parameters: name must be a string")
    try:
        spec = get_tool(name)
    except NotFound as unknown:
        raise MCPError(code=INVALID_PARAMS, message=f"Unknown tool: {name}", data=unknown.as_dict()) from None
    if spec.pipeline is None:
        raise MCPError(code=METHOD_NOT_FOUND, message=(
            f"Tool {name!r} does not support task-augmented execution; tools that do: "
            f"{', '.join(agent_view.long_tools())}"))
    if not isinstance(arguments, dict) or not isinstance(task, dict):
        raise MCPError(code=INVALID_PARAMS, message="Invalid request parameters: arguments and task must be objects")
    ttl = task.get("ttl")
    if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, int | float) or not ttl > 0):
        raise MCPError(code=INVALID_PARAMS, message="Invalid request parameters: task.ttl must be a positive number "
                                                    "of milliseconds")
    began = time.perf_counter()
    caller = authenticated_caller()
    meta = raw_meta if isinstance(raw_meta := params.get("_meta"), dict) else {}
    started, handle = await in_db_thread(start_task_for, name, caller_limits(), caller, arguments,
                                         meta.get(keys.META_KEY), legacy_task,
                                         # any longer is capped to the tool's deadline anyway
                                         timedelta(milliseconds=min(ttl, MAX_TTL_MS)) if ttl is not None else None)
    count_call(caller, name, started, began)
    if handle is None:  # refused before a task existed (bad input, a conflicting key): what the call would answer
        return render(started).model_dump(by_alias=True, mode="json", exclude_none=True)
    return {"task": handle, "_meta": {IMMEDIATE_RESPONSE: f"{name} runs as task {handle['taskId']}: "
                                                          f"{handle['statusMessage']}"}}


# --- 2026-07-28: subscriptions/listen for tasks -----------------------------------------------------------


def _own_task_ids(caller: Caller, task_ids: list[str]) -> list[str]:
    """The ids among `task_ids` of this tenant's tasks, in the order asked (others are left out, as unknown)."""
    valid = [task_id for task_id in task_ids if _is_uuid(task_id)]
    asked = list(dict.fromkeys(str(uuid.UUID(task_id)) for task_id in valid))
    own = {str(pk) for pk in Task.objects.filter(tenant_id=caller.tenant_id, pk__in=asked).values_list("pk", flat=True)}
    return [task_id for task_id in asked if task_id in own]


def _is_uuid(value: str) -> bool:
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True


async def _listen(ctx: ServerRequestContext[Any, Any], task_ids: Any) -> dict[str, Any]:
    require_client_extension(ctx, EXTENSION)
    if (not isinstance(task_ids, list) or not all(isinstance(task_id, str) for task_id in task_ids)
            or len(task_ids) > MAX_LISTEN_TASKS):
        raise MCPError(code=INVALID_PARAMS, message=(
            f"Invalid request parameters: notifications.taskIds must be a list of at most {MAX_LISTEN_TASKS} "
            "task ids"))
    caller = authenticated_caller()
    meta = {SUBSCRIPTION_ID_META_KEY: ctx.request_id}
    honoured = await in_db_thread(_own_task_ids, caller, task_ids)
    # taskIds is the tasks extension's key, which SubscriptionFilter keeps as an extra field.
    honoured_filter = SubscriptionFilter.model_validate({"taskIds": honoured})
    await ctx.session.send_notification(SubscriptionsAcknowledgedNotification(
        params=SubscriptionsAcknowledgedNotificationParams(notifications=honoured_filter, _meta=meta)),
        related_request_id=ctx.request_id)
    changes = task_watch.follow(caller, honoured, detailed_task, until=lambda task: task.finished,
                                max_seconds=conf().task_listen_max_seconds)
    async with aclosing(changes):
        async for changed in changes:
            for _, shape in changed:
                # The SDK's signature names its typed notifications; it sends any model with a method and
                # params, and Raw keeps `ttl: null` (see tasks_extension.Raw).
                await ctx.session.send_notification(Raw(  # type: ignore[arg-type]
                    method="notifications/tasks", params={**shape, "_meta": meta}), related_request_id=ctx.request_id)
    # This middleware answered the request itself, so it writes the envelope 2026-07-28 needs.
    return {"resultType": "complete", "_meta": meta}
