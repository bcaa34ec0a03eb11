"""MCP tasks, in both protocol versions that define them, from the same durable tasks.

The extension `io.modelcontextprotocol/tasks` (SEP-2663, protocol 2026-07-28),
served through the SDK's extension hooks (mcp 2.3 has no server-side tasks of
its own):

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

The tasks of protocol 2025-11-25 (what the TypeScript SDK 1.x speaks): the
same `tasks/get` and `tasks/cancel` bindings answer in that version's shapes
when the request's protocol version is 2025-11-25 (the SDK allows one binding
per method), plus `tasks/result` (blocks until the task is done, pushing
`notifications/tasks/status` and progress on its own stream meanwhile) and
`tasks/list`. What the SDK has no hook for at that version (the `task`
parameter of tools/call, the `tasks` capability, `execution.taskSupport`)
is task_protocols.py's middleware.

The status, by version: created, running, retrying and paused (by an
operator) are `working`; paused with an input request is `input_required`;
succeeded is `completed`; a failed task is `failed` at 2025-11-25 and a
`completed` call whose result has isError at 2026-07-28 (that version keeps
`failed` for JSON-RPC errors); cancelled is `cancelled`.

Tasks are bound to the tenant of the bearer token: another tenant's task id
is an unknown task id (-32602), like one that never existed.

Time-to-live: both versions define it from the task's creation (`ttlMs` at
2026-07-28, `ttl` at 2025-11-25, in milliseconds): past createdAt plus it, the
server may end the task as failed. That is the task's deadline (tasks.state:
its tool's, or the shorter one a 2025-11-25 caller asked for with tools/call's
`task.ttl`), so the answer is `deadline_at - created_at`, never null; it
changes when resume_task gives a failed task a new deadline. 2026-07-28 has
no way for a client to ask for one (task creation is the server's decision).
"""

from __future__ import annotations

import base64
import binascii
import json
import time
import uuid
from collections.abc import Callable, Mapping
from contextlib import aclosing
from datetime import datetime, timedelta
from typing import Any

from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import Extension, MethodBinding
from mcp.server.mcpserver.server import require_client_extension
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS, CallToolRequestParams, PaginatedRequestParams, RequestParams
from pydantic import BaseModel, Field

from tools_app import tasks
from tools_app.access import Agent, CallLimits
from tools_app.conf import conf
from tools_app.core import keys
from tools_app.core.errors import NotFound, ToolFailure
from tools_app.mcp import task_watch
from tools_app.mcp.runtime import admitted, authenticated_caller, caller_limits, count_call, in_db_thread, render
from tools_app.tasks import agent_view
from tools_app.tasks.models import Task, TaskStatus
from tools_app.toolkit.calls import Caller, CallResult
from tools_app.toolkit.registry import get_tool

EXTENSION = "io.modelcontextprotocol/tasks"
LEGACY, MODERN = "2025-11-25", "2026-07-28"
PROTOCOL_VERSIONS = frozenset({MODERN})
BOTH_VERSIONS = frozenset({LEGACY, MODERN})
RELATED_TASK = "io.modelcontextprotocol/related-task"
WORKING: dict[str, str] = {TaskStatus.CREATED: "working", TaskStatus.RUNNING: "working", TaskStatus.RETRYING: "working",
                           TaskStatus.SUCCEEDED: "completed", TaskStatus.FAILED: "completed",
                           TaskStatus.CANCELLED: "cancelled"}
# tasks/list (2025-11-25) answers this many tasks a page.
LIST_PAGE_SIZE = 50


class TaskIdParams(RequestParams):
    task_id: str


class Raw(BaseModel):
    """A notification sent as given: the SDK's typed task notifications drop `ttl: null` (they dump
    without None), which the spec requires and a TypeScript client's schema refuses to miss."""

    method: str
    params: dict[str, Any]


class UpdateTaskParams(TaskIdParams):
    input_responses: dict[str, Any] = Field(default_factory=dict)


def declares_extension(ctx: ServerRequestContext[Any, Any]) -> bool:
    capabilities = ctx.session.client_capabilities
    return (ctx.protocol_version in PROTOCOL_VERSIONS and capabilities is not None
            and EXTENSION in (capabilities.extensions or {}))


# --- the wire shapes --------------------------------------------------------------------------


def _iso(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


def input_request_keys(task: Task) -> dict[str, str]:
    """Wire key -> input name. Keys must be unique over a task's life, so each pause gets its own."""
    return {f"{name}.{task.version}": name for name in task.input_request or {}}


def status_of(task: Task, version: str = MODERN) -> str:
    if task.status == TaskStatus.PAUSED and task.input_request:
        return "input_required"
    if task.status == TaskStatus.FAILED and version == LEGACY:
        return "failed"
    return WORKING.get(task.status, "working")


def ttl_ms(task: Task) -> int | None:
    """The task's time-to-live in milliseconds from its creation: until its deadline (see the module's
    docstring). None only for a task that never had one (finished before deadlines existed)."""
    if task.deadline_at is None:
        return None
    return max(0, round((task.deadline_at - task.created_at) / timedelta(milliseconds=1)))


def task_shape(task: Task) -> dict[str, Any]:
    """The SEP-2663 `Task` fields (no result): for the handle and for tasks/get."""
    return {"taskId": str(task.pk), "status": status_of(task), "statusMessage": agent_view.next_action(task),
            "createdAt": _iso(task.created_at), "lastUpdatedAt": _iso(task.updated_at),
            "ttlMs": ttl_ms(task), "pollIntervalMs": conf().task_poll_interval_ms}


def detailed_task(task: Task) -> dict[str, Any]:
    """What tasks/get answers: the task plus its result or its outstanding input requests."""
    shape = task_shape(task)
    if shape["status"] == "completed":
        shape["result"] = call_result(task)
    elif shape["status"] == "input_required":
        requests = task.input_request or {}  # set: status_of said input_required
        shape["inputRequests"] = {key: _elicitation(name, requests[name])
                                  for key, name in input_request_keys(task).items()}
    return shape


def legacy_task(task: Task) -> dict[str, Any]:
    """The 2025-11-25 `Task`. `ttl` must be present (null would be: no time-to-live), so this is a plain dict."""
    return {"taskId": str(task.pk), "status": status_of(task, LEGACY), "statusMessage": agent_view.next_action(task),
            "createdAt": _iso(task.created_at), "lastUpdatedAt": _iso(task.updated_at), "ttl": ttl_ms(task),
            "pollInterval": conf().task_poll_interval_ms}


def call_result(task: Task) -> dict[str, Any]:
    """The CallToolResult the task stands for, as the wire carries it (the tool's result, or the error
    saying why there is none)."""
    return render(agent_view.outcome(get_tool(task.tool), task)).model_dump(by_alias=True, mode="json",
                                                                             exclude_none=True)


def related(task_id: str, result: dict[str, Any] | None = None) -> dict[str, Any]:
    """`result` with the related-task _meta every 2025-11-25 message about a task carries."""
    result = dict(result or {})
    result["_meta"] = {**result.get("_meta", {}), RELATED_TASK: {"taskId": task_id}}
    return result


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


def _get(caller: Caller, task_id: str, version: str) -> dict[str, Any]:
    task = _task(caller, task_id)
    return legacy_task(task) if version == LEGACY else detailed_task(task)


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


def _cancel(caller: Caller, task_id: str, version: str) -> dict[str, Any]:
    task = _task(caller, task_id)
    if version == LEGACY and task.finished:
        # 2025-11-25 answers the Task, and refuses a task already final.
        raise MCPError(code=INVALID_PARAMS,
                       message=f"Cannot cancel task: already in terminal status '{status_of(task, LEGACY)}'")
    try:
        task = tasks.cancel(task, Agent(caller.tenant_id, caller.actor), reason="tasks/cancel")
    except ToolFailure as refused:
        if version == LEGACY:  # it finished between the read and the cancel
            raise MCPError(code=INVALID_PARAMS, message=f"Cannot cancel task: {refused.message}") from None
        # 2026-07-28: cancellation is cooperative, the ack stands
    return legacy_task(task) if version == LEGACY else {}


def _list(caller: Caller, cursor: str | None) -> dict[str, Any]:
    """The caller's tenant's tasks, newest first, a page at a time (keyset on created_at, id)."""
    page = Task.objects.filter(tenant_id=caller.tenant_id).order_by("-created_at", "-id")
    if cursor is not None:
        created_at, task_id = _read_cursor(cursor)
        page = page.filter(created_at__lte=created_at).exclude(created_at=created_at, id__gte=task_id)
    found = list(page[:LIST_PAGE_SIZE + 1])
    answer: dict[str, Any] = {"tasks": [legacy_task(task) for task in found[:LIST_PAGE_SIZE]]}
    if len(found) > LIST_PAGE_SIZE:
        last = found[LIST_PAGE_SIZE - 1]
        answer["nextCursor"] = base64.urlsafe_b64encode(
            json.dumps([last.created_at.isoformat(), str(last.pk)]).encode()).decode()
    return answer


def _read_cursor(cursor: str) -> tuple[datetime, str]:
    try:
        created_at, task_id = json.loads(base64.urlsafe_b64decode(cursor.encode()))
        return datetime.fromisoformat(created_at), str(uuid.UUID(task_id))
    except (ValueError, TypeError, binascii.Error):
        raise MCPError(code=INVALID_PARAMS, message="Invalid cursor") from None


def _result_view(task: Task) -> dict[str, Any]:
    """What a waiting tasks/result sends as the task changes (computed in the database thread)."""
    return {"status": legacy_task(task), "progress": agent_view.overall_progress(task),
            "total": float(task.steps_total), "message": agent_view.progress_message(task),
            "result": call_result(task) if task.finished else None}


def start_task_for(name: str, limits: CallLimits, caller: Caller, arguments: dict[str, Any], meta_key: str | None,
                   shape: Callable[[Task], dict[str, Any]] = task_shape, deadline: timedelta | None = None
                   ) -> tuple[CallResult, dict[str, Any] | None]:
    """A long tool's call as the start_task operation for it, once the caller's rate limits admit
    it: (the call's result, the task's `shape`, or None when it was refused before a task existed).
    `deadline`: the shorter deadline the caller asked for (a 2025-11-25 `task.ttl`)."""
    spec = get_tool(name)
    outcome: dict[str, Task | None] = {"task": None}

    def start() -> CallResult:
        started, task = agent_view.start_through_engine(spec, caller, arguments, meta_key, deadline)
        outcome["task"] = task
        return started

    started = admitted(spec, limits, start)
    task = outcome["task"]
    return started, (shape(task) if task is not None else None)


# --- the extension -------------------------------------------------------------------------------


class TasksExtension(Extension):
    identifier = EXTENSION

    def methods(self) -> list[MethodBinding]:
        legacy = frozenset({LEGACY})
        return [
            MethodBinding("tasks/get", TaskIdParams, self.get, protocol_versions=BOTH_VERSIONS),
            MethodBinding("tasks/update", UpdateTaskParams, self.update, protocol_versions=PROTOCOL_VERSIONS),
            MethodBinding("tasks/cancel", TaskIdParams, self.cancel, protocol_versions=BOTH_VERSIONS),
            MethodBinding("tasks/result", TaskIdParams, self.result, protocol_versions=legacy),
            MethodBinding("tasks/list", PaginatedRequestParams, self.list, protocol_versions=legacy),
        ]

    async def intercept_tool_call(self, params: CallToolRequestParams, ctx: ServerRequestContext[Any, Any],
                                  call_next: CallNext) -> HandlerResult:
        if not declares_extension(ctx) or not _is_long_tool(params.name):
            return await call_next(ctx)
        began = time.perf_counter()
        caller = authenticated_caller()
        # _meta is the client's JSON: a key that is not a string is refused by keys.validate_key.
        meta: Mapping[str, Any] = ctx.meta or {}
        started, handle = await in_db_thread(start_task_for, params.name, caller_limits(), caller,
                                             dict(params.arguments or {}), meta.get(keys.META_KEY))
        count_call(caller, params.name, started, began)
        if handle is None:
            return render(started)  # refused before a task existed: an ordinary tool error
        return {"resultType": "task", **handle}

    async def get(self, ctx: ServerRequestContext[Any, Any], params: TaskIdParams) -> dict[str, Any]:
        if ctx.protocol_version != LEGACY:  # a 2025-11-25 client declares no extensions: tasks are core there
            require_client_extension(ctx, EXTENSION)
        return await in_db_thread(_get, authenticated_caller(), params.task_id, ctx.protocol_version)

    async def update(self, ctx: ServerRequestContext[Any, Any], params: UpdateTaskParams) -> dict[str, Any]:
        require_client_extension(ctx, EXTENSION)
        return await in_db_thread(_update, authenticated_caller(), params.task_id, params.input_responses)

    async def cancel(self, ctx: ServerRequestContext[Any, Any], params: TaskIdParams) -> dict[str, Any]:
        if ctx.protocol_version != LEGACY:
            require_client_extension(ctx, EXTENSION)
        return await in_db_thread(_cancel, authenticated_caller(), params.task_id, ctx.protocol_version)

    async def list(self, ctx: ServerRequestContext[Any, Any], params: PaginatedRequestParams) -> dict[str, Any]:
        return await in_db_thread(_list, authenticated_caller(), params.cursor)

    async def result(self, ctx: ServerRequestContext[Any, Any], params: TaskIdParams) -> dict[str, Any]:
        """2025-11-25 tasks/result: the task's CallToolResult once it is done; until then the request
        stays open (holding no database thread), and each change of the task is pushed on its stream:
        `notifications/tasks/status`, and `notifications/progress` if the request has a progressToken."""
        caller = authenticated_caller()
        task_id = str((await in_db_thread(_task, caller, params.task_id)).pk)
        token = ctx.meta.get("progress_token") if ctx.meta else None
        reported, final = -1.0, None
        changes = task_watch.follow(caller, [task_id], _result_view, until=lambda task: task.finished)
        async with aclosing(changes):
            async for changed in changes:
                for _, view in changed:
                    await ctx.session.send_notification(
                        # The SDK's signature names its typed notifications; it sends any model with a method
                        # and params, and Raw keeps `ttl: null` (see Raw).
                        Raw(method="notifications/tasks/status",  # type: ignore[arg-type]
                            params=related(task_id, view["status"])),
                        related_request_id=ctx.request_id)
                    if token is not None and view["progress"] > reported:
                        reported = view["progress"]
                        await ctx.session.send_progress_notification(
                            token, view["progress"], view["total"], view["message"],
                            # The SDK's stub says str; it passes the id on to send_notification, which takes
                            # any JSON-RPC request id (str or int).
                            related_request_id=ctx.request_id)  # type: ignore[arg-type]
                    final = view["result"] or final
        if final is None:  # the task is gone (removed past its retention)
            raise MCPError(code=INVALID_PARAMS, message="Failed to retrieve task: Task not found")
        return related(task_id, final)


def _is_long_tool(name: str) -> bool:
    try:
        return get_tool(name).pipeline is not None
    except NotFound:
        return False

