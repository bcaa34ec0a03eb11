"""Task tools: start_task, get_task_status, get_task_result, resume_task, cancel_task, pause_task,
fork_task.

Thin declarations over tools_app.tasks.agent_view (what an agent sees) and
tools_app.tasks (the state machine). Task ids are bound to the tenant: another
tenant's id is `not_found`, exactly like an id that does not exist.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from pydantic import BaseModel, Field, PrivateAttr

from tools_app import tasks
from tools_app.access import Agent
from tools_app.conf import conf
from tools_app.core.polling import Pending, after
from tools_app.tasks import agent_view
from tools_app.tasks import forks as task_forks
from tools_app.tasks.agent_view import TaskHandle, TaskStatusView
from tools_app.tasks.forks import ForkHandle
from tools_app.tasks.models import Task, TaskStatus
from tools_app.toolkit.registry import ToolContext, ToolInput, WriteInput, read_tool, write_tool

# The schema states the real limit (the setting, read when the tools are declared); more is invalid_input,
# never a silently shorter wait.
MAX_WAIT_SECONDS = conf().task_max_wait_seconds
WAIT_RULE = ("Seconds to wait for the task to finish (or pause) before answering, with progress notifications "
             f"when the call has a progressToken. 0 answers at once; at most {MAX_WAIT_SECONDS:g} "
             "(call again to wait longer).")


class StartTaskInput(WriteInput):
    tool: str = Field(min_length=1, max_length=100,
                      description="The long tool to run (tools/list marks it with execution.taskSupport).")
    arguments: dict[str, Any] = Field(
        default_factory=dict, description="That tool's arguments (without idempotency_key and trace_id).")
    notify_url: str | None = Field(
        None, min_length=8, max_length=500,
        description="A webhook URL (on the server's webhook allow-list) that receives a POST when the task "
                    "finishes (succeeded, failed or cancelled), with headers X-Event-Id and Idempotency-Key "
                    "(the same on every redelivery) and the task's final status as JSON.")
    # Not arguments: the long tool and its arguments once validated (tasks.agent_view.inner_of), and the
    # shorter deadline a caller asked for (agent_view.begin).
    _inner: Any = PrivateAttr(default=None)
    _deadline: timedelta | None = PrivateAttr(default=None)


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


class PauseTaskInput(WriteInput):
    task_id: str = Field(min_length=1, max_length=64)
    reason: str = Field(min_length=1, max_length=500, description="Why it must wait; kept as its pause_reason.")


class ForkTaskInput(WriteInput):
    task_id: str = Field(min_length=1, max_length=64, description="The task to re-run from a step.")
    from_step: str = Field(min_length=1, max_length=100,
                           description="The first step to run again (a name from get_task_status' "
                                       "completed_steps, or the step after the last of them).")
    reason: str = Field("", max_length=500)


class TaskResult(BaseModel):
    task_id: str
    tool: str
    status: str
    result: dict[str, Any]


# The task tools that start or steer a task: an OAuth token needs the `long` scope for them (mcp.guards).
TASK_WRITE_TOOLS = frozenset({"start_task", "resume_task", "cancel_task", "pause_task", "fork_task"})


@write_tool(name="start_task", title="Start a long task",
            check=agent_view.check_start, operation_arguments=agent_view.start_arguments,
            # The long tool's own arguments: any of them may be personal (a document's text); the
            # webhook to tell, as send_notification's recipient.
            personal_fields=frozenset({"arguments", "notify_url"}))
def start_task(ctx: ToolContext, args: StartTaskInput) -> TaskHandle:
    """Start a long tool as a durable task and return its task_id at once. The task survives
    disconnects and worker restarts and resumes from its last checkpoint. Requires idempotency_key: a retry with
    the same key returns the same task_id (never a second task) for as long as the task is unfinished, and for
    the long tool's retention (24 h by default) after it ends; only then may the key start a new task. The same
    key with other arguments is a conflict. notify_url: a webhook told when the task finishes."""
    return agent_view.handle(agent_view.start(ctx, args))


@read_tool(name="get_task_status", title="Get a task's status", personal_fields=frozenset())
def get_task_status(ctx: ToolContext, args: WaitingInput) -> TaskStatusView | Pending[TaskStatusView]:
    """Status of a task: current step, steps done/total, progress, failure class and reason, whether it can be
    cancelled or resumed, and what to do next. wait_seconds waits for it to finish, reporting progress."""
    task = tasks.get_for_tenant(ctx.tenant_id, args.task_id)
    return after(agent_view.wait_for(task, args.wait_seconds, ctx.report_progress), agent_view.describe)


@read_tool(name="get_task_result", title="Get a task's result",
           personal_fields=frozenset())
def get_task_result(ctx: ToolContext, args: WaitingInput) -> TaskResult | Pending[TaskResult]:
    """The result of a succeeded task. Otherwise an error: in_progress (still working, with the task's status),
    the task's failure class and reason, or already_done for a cancelled task. wait_seconds waits for it."""
    task = tasks.get_for_tenant(ctx.tenant_id, args.task_id)
    return after(agent_view.wait_for(task, args.wait_seconds, ctx.report_progress), _result)


def _result(task: Task) -> TaskResult:
    if task.status != TaskStatus.SUCCEEDED:
        raise agent_view.unfinished(task)
    assert task.result is not None  # a succeeded task keeps its result
    return TaskResult(task_id=str(task.pk), tool=task.tool, status=task.status, result=task.result)


@write_tool(name="resume_task", title="Resume a task",
            personal_fields=frozenset({"input"}))
def resume_task(ctx: ToolContext, args: ResumeTaskInput) -> TaskStatusView:
    """Continue a paused task (with the input it asked for), retry a backing-off or transiently failed task now,
    or revive one whose worker died; it restarts from its last valid checkpoint. Refused, with the reason, for
    tasks that succeeded, were cancelled, or failed in a way another run would repeat."""
    task = tasks.get_for_tenant(ctx.tenant_id, args.task_id)
    return agent_view.describe(tasks.resume(task, Agent(ctx.tenant_id, ctx.actor), answer=args.input))


@write_tool(name="cancel_task", title="Cancel a task",
            personal_fields=frozenset({"reason"}))
def cancel_task(ctx: ToolContext, args: CancelTaskInput) -> TaskStatusView:
    """Cancel a task now: it is marked cancelled at once and no further step starts (a step in progress stops at
    its next check). Cancelling a cancelled task is a no-op; a finished task cannot be cancelled."""
    task = tasks.get_for_tenant(ctx.tenant_id, args.task_id)
    return agent_view.describe(tasks.cancel(task, Agent(ctx.tenant_id, ctx.actor), reason=args.reason))


@write_tool(name="pause_task", title="Pause a task",
            personal_fields=frozenset({"reason"}))
def pause_task(ctx: ToolContext, args: PauseTaskInput) -> TaskStatusView:
    """Pause a task: a queued or backing-off task at once; a running one at its next step boundary (the step in
    progress finishes and is checkpointed, the next one does not start). resume_task continues it from there."""
    task = tasks.get_for_tenant(ctx.tenant_id, args.task_id)
    return agent_view.describe(tasks.pause(task, Agent(ctx.tenant_id, ctx.actor), reason=args.reason))


@write_tool(name=tasks.FORK_OPERATION, title="Re-run a task from a step", personal_fields=frozenset({"reason"}))
def fork_task(ctx: ToolContext, args: ForkTaskInput) -> ForkHandle:
    """Re-run a task from one of its steps, in a new task: the steps before it are reused from the original's
    verified checkpoints, from_step and the steps after it run again (with their effects). The original is left
    as it is. Requires idempotency_key: a retry with the same key returns the same new task for as long as it is
    unfinished, and for its tool's retention (24 h by default) after it ends."""
    task = tasks.get_for_tenant(ctx.tenant_id, args.task_id)
    return task_forks.handle(tasks.fork(task, Agent(ctx.tenant_id, ctx.actor), from_step=args.from_step,
                                         reason=args.reason, record=ctx.record))
