"""The MCP tasks extension (`io.modelcontextprotocol/tasks`, SEP-2663, protocol 2026-07-28).

Served from the same durable store as the task tools, through the SDK's
extension hooks (mcp 2.3 has no server-side tasks of its own):

- `tools/call` of a long tool, from a client that declares the extension on
  the request, answers at once with a task handle (`resultType: "task"`)
  instead of waiting. It is the same operation as start_task for that tool:
  the same idempotency key returns the same task.
- `tasks/get` reports the task (working, input_required, completed,
  cancelled) and, once it is done, carries the tool's CallToolResult; a
  failed task is a *completed* call whose result has isError (the spec keeps
  `failed` for JSON-RPC errors).
- `tasks/update` delivers `inputResponses` to a task paused on an input
  request (it resumes); `tasks/cancel` cancels.

Tasks are bound to the tenant of the bearer token: another tenant's task id
is an unknown task id (-32602), like one that never existed.
"""

from __future__ import annotations

import time
from typing import Any

from mcp.server.extension import Extension, MethodBinding
from mcp.server.mcpserver.server import require_client_extension
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS, CallToolRequestParams, RequestParams
from pydantic import Field

from idemops.conf import conf
from tools_app import tasks
from tools_app.access import Agent
from tools_app.core import keys
from tools_app.core.errors import NotFound, ToolFailure
from tools_app.mcp.runtime import admitted, authenticated_caller, caller_limits, count_call, in_db_thread, render
from tools_app.tasks import calls as task_calls
from tools_app.tasks.models import Task, TaskStatus
from tools_app.toolkit.calls import Caller
from tools_app.toolkit.registry import get_tool

EXTENSION = "io.modelcontextprotocol/tasks"
PROTOCOL_VERSIONS = frozenset({"2026-07-28"})
WORKING = {TaskStatus.CREATED: "working", TaskStatus.RUNNING: "working", TaskStatus.RETRYING: "working",
           TaskStatus.SUCCEEDED: "completed", TaskStatus.FAILED: "completed", TaskStatus.CANCELLED: "cancelled"}


class TaskIdParams(RequestParams):
    task_id: str


class UpdateTaskParams(TaskIdParams):
    input_responses: dict[str, Any] = Field(default_factory=dict)


def declares_extension(ctx) -> bool:
    capabilities = ctx.session.client_capabilities
    return (ctx.protocol_version in PROTOCOL_VERSIONS and capabilities is not None
            and bool(capabilities.extensions) and EXTENSION in capabilities.extensions)


# --- the wire shapes --------------------------------------------------------------------------


def _iso(moment) -> str:
    return moment.isoformat().replace("+00:00", "Z")


def input_request_keys(task: Task) -> dict[str, str]:
    """Wire key -> input name. Keys must be unique over a task's life, so each pause gets its own."""
    return {f"{name}.{task.version}": name for name in task.input_request or {}}


def task_shape(task: Task) -> dict[str, Any]:
    """The SEP-2663 `Task` fields (no result): for the handle and for tasks/get."""
    status = WORKING.get(task.status, "working")
    if task.status == TaskStatus.PAUSED and task.input_request:
        status = "input_required"
    return {"taskId": str(task.pk), "status": status, "statusMessage": task_calls.next_action(task),
            "createdAt": _iso(task.created_at), "lastUpdatedAt": _iso(task.updated_at),
            # Tasks are kept, not purged: no time-to-live.
            "ttlMs": None, "pollIntervalMs": conf().task_poll_interval_ms}


def detailed_task(task: Task) -> dict[str, Any]:
    """What tasks/get answers: the task plus its result or its outstanding input requests."""
    shape = task_shape(task)
    if shape["status"] == "completed":
        result = render(task_calls.outcome(get_tool(task.tool), task))
        shape["result"] = result.model_dump(by_alias=True, mode="json", exclude_none=True)
    elif shape["status"] == "input_required":
        shape["inputRequests"] = {key: _elicitation(name, task.input_request[name])
                                  for key, name in input_request_keys(task).items()}
    return shape


def _elicitation(name: str, request: dict[str, Any]) -> dict[str, Any]:
    return {"method": "elicitation/create", "params": {
        "mode": "form", "message": request.get("message", f"The task needs {name}."),
        "requestedSchema": {"type": "object", "properties": {name: request.get("schema", {})}, "required": [name]},
    }}


def answers_from(task: Task, responses: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """(answers by input name, declined?) from the inputResponses for outstanding keys; others are ignored."""
    answers, declined = {}, False
    for key, name in input_request_keys(task).items():
        response = responses.get(key)
        if not isinstance(response, dict):
            continue
        if response.get("action") != "accept":
            declined = True
        elif isinstance(response.get("content"), dict) and name in response["content"]:
            answers[name] = response["content"][name]
    return answers, declined


# --- database work (run in a worker thread) ------------------------------------------------------


def _task(caller: Caller, task_id: str) -> Task:
    try:
        return tasks.get_for_tenant(caller.tenant_id, task_id)
    except NotFound:
        raise MCPError(code=INVALID_PARAMS, message="Failed to retrieve task: Task not found") from None


def _get(caller: Caller, task_id: str) -> dict[str, Any]:
    return detailed_task(_task(caller, task_id))


def _update(caller: Caller, task_id: str, responses: dict[str, Any]) -> dict[str, Any]:
    task = _task(caller, task_id)
    if task.status != TaskStatus.PAUSED:
        return {}  # nothing outstanding: responses are ignored, as the spec asks
    answers, declined = answers_from(task, responses)
    try:
        if declined:
            tasks.cancel(task, Agent(caller.tenant_id, caller.actor), reason="the requested input was declined")
        elif answers:
            tasks.resume(task, Agent(caller.tenant_id, caller.actor), answer=answers)
    except ToolFailure as failure:
        raise MCPError(code=INVALID_PARAMS, message=failure.message) from None
    return {}


def _cancel(caller: Caller, task_id: str) -> dict[str, Any]:
    task = _task(caller, task_id)
    try:
        tasks.cancel(task, Agent(caller.tenant_id, caller.actor), reason="tasks/cancel")
    except ToolFailure:
        pass  # already finished: cancellation is cooperative, the ack stands
    return {}


def _admitted_start(name: str, limits, caller: Caller, arguments: dict[str, Any], meta_key: str | None):
    spec = get_tool(name)
    outcome: dict[str, Any] = {"task": None}

    def start():
        started, task = task_calls.start_through_engine(spec, caller, arguments, meta_key)
        outcome["task"] = task
        return started

    started = admitted(spec, limits, start)
    return started, (task_shape(outcome["task"]) if outcome["task"] is not None else None)


# --- the extension -------------------------------------------------------------------------------


class TasksExtension(Extension):
    identifier = EXTENSION

    def methods(self) -> list[MethodBinding]:
        return [
            MethodBinding("tasks/get", TaskIdParams, self.get, protocol_versions=PROTOCOL_VERSIONS),
            MethodBinding("tasks/update", UpdateTaskParams, self.update, protocol_versions=PROTOCOL_VERSIONS),
            MethodBinding("tasks/cancel", TaskIdParams, self.cancel, protocol_versions=PROTOCOL_VERSIONS),
        ]

    async def intercept_tool_call(self, params: CallToolRequestParams, ctx, call_next):
        if not declares_extension(ctx) or not _is_long_tool(params.name):
            return await call_next(ctx)
        began = time.perf_counter()
        caller = authenticated_caller()
        meta = ctx.meta or {}
        started, handle = await in_db_thread(_admitted_start, params.name, caller_limits(), caller,
                                             dict(params.arguments or {}), meta.get(keys.META_KEY))
        count_call(caller, params.name, started, began)
        if handle is None:
            return render(started)  # refused before a task existed: an ordinary tool error
        return {"resultType": "task", **handle}

    async def get(self, ctx, params: TaskIdParams) -> dict[str, Any]:
        require_client_extension(ctx, EXTENSION)
        return await in_db_thread(_get, authenticated_caller(), params.task_id)

    async def update(self, ctx, params: UpdateTaskParams) -> dict[str, Any]:
        require_client_extension(ctx, EXTENSION)
        return await in_db_thread(_update, authenticated_caller(), params.task_id, params.input_responses)

    async def cancel(self, ctx, params: TaskIdParams) -> dict[str, Any]:
        require_client_extension(ctx, EXTENSION)
        return await in_db_thread(_cancel, authenticated_caller(), params.task_id)


def _is_long_tool(name: str) -> bool:
    try:
        return get_tool(name).pipeline is not None
    except NotFound:
        return False

