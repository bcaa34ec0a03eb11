"""Forking a task: re-running its pipeline from step N in a new task, as DBOS's fork does.

The fork is a new task of the same tool and arguments, linked to the original
(`forked_from`, `forked_at_step`). The original's checkpoints of the steps
before N are verified (checksum and input digest, as a resume would) and
copied to the fork, artifacts included, so the fork's runner reuses them and
starts at step N; the original is not touched. A fork from a step whose
earlier checkpoints are missing or invalid is refused, naming the furthest
step it could start from.

A fork is an operation of its own (`fork_task`) under the idempotency
engine: the same key forks once, whoever asks again. An agent forks through
the `fork_task` tool (its key); an operator through the admin, whose form
carries a key of its own, so a form sent twice forks once (`fork_operation`).
Either way `fork` checks FORK first and audits the fork on both tasks.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from django.db import transaction
from django.utils import timezone
from pydantic import BaseModel, Field

from tools_app import engine
from tools_app.access import Permit, authorize
from tools_app.core import audit
from tools_app.core.errors import InvalidInput
from tools_app.engine.models import IdempotencyRecord
from tools_app.tasks import checkpoints, state
from tools_app.tasks.control import MANAGE_PERMISSION
from tools_app.tasks.models import Checkpoint, Task, TaskArtifact
from tools_app.toolkit.registry import get_tool

if TYPE_CHECKING:
    from django.contrib.auth.models import AnonymousUser, User

    from tools_app.access import Agent

FORK_OPERATION = "fork_task"

FORK = Permit(MANAGE_PERMISSION, "fork", "manage tasks", "task.fork_refused", agents=True)


def fork(task: Task, who: Agent | User | AnonymousUser, *, from_step: str, reason: str,
         record: IdempotencyRecord) -> Task:
    """A new task re-running `task` from `from_step`, created inside the fork operation's
    transaction (`record`, whose one task it is), and queued."""
    actor = authorize(who, FORK, task)
    pipeline = get_tool(task.tool).pipeline
    index = step_index(task, from_step)
    reused = checkpoints.valid_prefix(task, pipeline, actor=actor)
    if reused.next_index < index:
        reachable = pipeline.steps[reused.next_index].name
        raise InvalidInput(
            f"from_step: task {task.pk} has verified checkpoints for its first {reused.next_index} steps only; "
            f"fork from {reachable!r} or an earlier step")
    if reused.failed_at is not None:
        # A saga that compensated undid its steps: a fork must not reuse what was undone (a cancelled
        # mandate, a closed customer). It may start at the first step that was undone, or before it.
        undone = next((i for i, step in enumerate(pipeline.steps[:reused.failed_at]) if step.compensate), None)
        if undone is not None and index > undone:
            raise InvalidInput(
                f"from_step: task {task.pk} undid its steps from {pipeline.steps[undone].name!r} on (step "
                f"{pipeline.steps[reused.failed_at].name!r} failed for good); fork from "
                f"{pipeline.steps[undone].name!r} or an earlier step")
    names = [step.name for step in pipeline.steps[:index]]
    with transaction.atomic():
        new = state.create_task(
            record=record, tool=task.tool, arguments=task.arguments, sealed_arguments=task.sealed_arguments,
            input_digest=task.input_digest, steps_total=len(pipeline.steps),
            max_attempts=pipeline.retry.attempts_allowed(), actor=actor, trace_id=task.trace_id,
            notify_url=task.notify_url, forked_from=task, forked_at_step=from_step, completed_steps=names)
        _copy_checkpoints(task, new, index)
        audit.record_event(action="task.forked", obj=new, actor=actor, reason=reason, trace_id=task.trace_id,
                           after={"forked_from": str(task.pk), "from_step": from_step, "reused_steps": names})
        audit.record_event(action="task.fork_created", obj=task, actor=actor, reason=reason, trace_id=task.trace_id,
                           after={"fork": str(new.pk), "from_step": from_step})
    return new


def step_index(task: Task, from_step: str) -> int:
    names = [step.name for step in get_tool(task.tool).pipeline.steps]
    if from_step not in names:
        raise InvalidInput(f"from_step: {task.tool} has no step {from_step!r}; its steps are {', '.join(names)}")
    return names.index(from_step)


def _copy_checkpoints(original: Task, new: Task, before: int) -> None:
    """The original's checkpoints of the first `before` steps, as the fork's own (a large output's
    artifact is copied too: the fork must not depend on rows the original's retention removes)."""
    now = timezone.now()
    for checkpoint in Checkpoint.objects.filter(task=original, sequence__lt=before).select_related("artifact"):
        artifact = None
        if (stored := checkpoint.artifact) is not None:
            artifact = TaskArtifact.objects.create(task=new, sha256=stored.sha256, size=stored.size, data=stored.data,
                                                   created_at=now)
        Checkpoint.objects.create(task=new, step=checkpoint.step, sequence=checkpoint.sequence,
                                  input_digest=checkpoint.input_digest, output_inline=checkpoint.output_inline,
                                  artifact=artifact, checksum=checkpoint.checksum, finished_at=checkpoint.finished_at)


class ForkHandle(BaseModel):
    """What a fork operation answers (and replays): the fork_task tool's output."""

    task_id: str = Field(description="The new task.")
    tool: str
    forked_from: str
    from_step: str
    created_at: datetime
    next_action: str


def handle(task: Task) -> ForkHandle:
    return ForkHandle(task_id=str(task.pk), tool=task.tool, forked_from=str(task.forked_from_id),
                      from_step=task.forked_at_step, created_at=task.created_at,
                      next_action="Poll get_task_status with this task_id; get_task_result once it succeeded. "
                                  "Retrying with the same idempotency_key returns this same fork.")


def fork_operation(task: Task, who: Agent | User | AnonymousUser, *, from_step: str, reason: str, key: str) -> Task:
    """An operator's fork: the fork_task operation under `key`, outside a tool call (the admin)."""
    actor = authorize(who, FORK, task)  # a refusal is audited before any key is claimed
    step_index(task, from_step)
    operation = engine.Operation(
        tenant_id=task.tenant_id, tool=FORK_OPERATION, key=key, actor=actor, trace_id=task.trace_id,
        arguments={"task_id": str(task.pk), "from_step": from_step, "reason": reason})
    outcome = engine.run(operation, lambda record: handle(fork(
        task, who, from_step=from_step, reason=reason, record=record)).model_dump(mode="json"))
    if outcome.error is not None:
        raise outcome.error
    assert outcome.result is not None, "a call without an error has a result"
    return Task.objects.get(pk=outcome.result["task_id"])
