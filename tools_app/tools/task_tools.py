"""Task tools: start_task, get_task_status, get_task_result, resume_task, cancel_task.

Thin declarations over tools_app.tasks.calls (what an agent sees) and
tools_app.tasks (the state machine). Task ids are bound to the tenant: another
tenant's id is `not_found`, exactly like an id that does not exist.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from idemops.conf import conf
from tools_app import tasks
from tools_app.access import Agent
from tools_app.tasks import calls as task_calls
from tools_app.tasks.calls import TaskHandle, TaskStatusView
from tools_app.tasks.models import TaskStatus
from tools_app.toolkit.registry import ToolContext, ToolInput, WriteInput, read_tool, write_tool

# The schema states the real limit (the setting, read when the tools are declared); more is invalid_input,
# never a silently shorter wait.
MAX_WAIT_SECONDS = conf().task_max_wait_seconds
WAIT_RULE = ("Seconds to wait for the task to finish (or pause) before answering, with progress notifications "
             f"when the call has a progressToken. 0 answers at once; at most {MAX_WAIT_SECONDS:g} "
             "(call again to wait longer).")


class StartTaskInput(WriteInput):
    tool: str = Field(min_length=1, max_length=100, description="The long tool to run, e.g. ingest_document.")
    arguments: dict[str, Any] = Field(
        default_factory=dict, description="That tool's arguments (without idempotency_key and trace_id).")


class TaskIdInput(ToolInput):
    task_id: str = Field(min_length=1, max_length=64)


class WaitingInput(TaskIdInput):
    wait_seconds: float = Field(0, ge=0, le=MAX_WAIT_SECONDS, description=WAIT_RULE)


class ResumeTaskInput(WriteInput):
    task_id: str = Field(min_length=1, max_length=64)
    input: dict[str, Any] | None = Field(
        None, description="For a paused task: answers to its input_request, by key.")


class CancelTaskInput(WriteInput):
    task_id: str = Field(min_length=1, max_length=64)
    reason: str = Field("", max_length=500)


class TaskResult(BaseModel):
    task_id: str
    tool: str
    status: str
    result: dict[str, Any]


@write_tool(name="start_task", title="Start a long task", input_model=StartTaskInput, output_model=TaskHandle,
            check=task_calls.check_start)
def start_task(ctx: ToolContext, args: StartTaskInput) -> TaskHandle:
    """Start a long tool (ingest_document) as a durable task and return its task_id at once. The task survives
    disconnects and worker restarts and resumes from its last checkpoint. Requires idempotency_key: a retry with
    the same key returns the same task_id (never a second task); the same key with other arguments is a
    conflict."""
    return task_calls.start(ctx, args.tool, args.arguments, args.idempotency_key)


@read_tool(name="get_task_status", title="Get a task's status", input_model=WaitingInput,
           output_model=TaskStatusView)
def get_task_status(ctx: ToolContext, args: WaitingInput) -> TaskStatusView:
    """Status of a task: current step, steps done/total, progress, failure class and reason, whether it can be
    cancelled or resumed, and what to do next. wait_seconds waits for it to finish, reporting progress."""
    task = tasks.get_for_tenant(ctx.tenant_id, args.task_id)
    task = task_calls.wait_for(task, args.wait_seconds, ctx.report_progress)
    return task_calls.describe(task)


@read_tool(name="get_task_result", title="Get a task's result", input_model=WaitingInput, output_model=TaskResult)
def get_task_result(ctx: ToolContext, args: WaitingInput) -> TaskResult:
    """The result of a succeeded task. Otherwise an error: in_progress (still working, with the task's status),
    the task's failure class and reason, or already_done for a cancelled task. wait_seconds waits for it."""
    task = tasks.get_for_tenant(ctx.tenant_id, args.task_id)
    task = task_calls.wait_for(task, args.wait_seconds, ctx.report_progress)
    if task.status != TaskStatus.SUCCEEDED:
        raise task_calls.unfinished(task)
    return TaskResult(task_id=str(task.pk), tool=task.tool, status=task.status, result=task.result)


@write_tool(name="resume_task", title="Resume a task", input_model=ResumeTaskInput, output_model=TaskStatusView)
def resume_task(ctx: ToolContext, args: ResumeTaskInput) -> TaskStatusView:
    """Continue a paused task (with the input it asked for), retry a backing-off or transiently failed task now,
    or revive one whose worker died; it restarts from its last valid checkpoint. Refused, with the reason, for
    tasks that succeeded, were cancelled, or failed in a way another run would repeat."""
    task = tasks.get_for_tenant(ctx.tenant_id, args.task_id)
    return task_calls.describe(tasks.resume(task, Agent(ctx.tenant_id, ctx.actor), answer=args.input))


@write_tool(name="cancel_task", title="Cancel a task", input_model=CancelTaskInput, output_model=TaskStatusView)
def cancel_task(ctx: ToolContext, args: CancelTaskInput) -> TaskStatusView:
    """Cancel a task now: it is marked cancelled at once and no further step starts (a step in progress stops at
    its next check). Cancelling a cancelled task is a no-op; a finished task cannot be cancelled."""
    task = tasks.get_for_tenant(ctx.tenant_id, args.task_id)
    return task_calls.describe(tasks.cancel(task, Agent(ctx.tenant_id, ctx.actor), reason=args.reason))
