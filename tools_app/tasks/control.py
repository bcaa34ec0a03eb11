"""What agents and operators do to a task: cancel, pause, resume. Each checks its Permit first
(access.authorize): operators need `manage_task` on the task's tenant; an agent may cancel,
pause and resume its own tenant's tasks (the MCP task tools and the tasks extension).

Each is a read-decide-UPDATE with the version guard, retried when a worker moved the task
between the read and the UPDATE (`_with_retries`). One that loses that race every round answers
`transient` with a retry_after: under a tool call's key that is a failure the same key runs
again after the wait, never the key's final answer.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import jsonschema
from django.db import transaction

from tools_app import engine
from tools_app.access import Permit, authorize
from tools_app.core import clock, db, personal
from tools_app.core.errors import (
    INTERNAL_ERROR_ADVICE,
    AlreadyDone,
    ErrorClass,
    InternalError,
    InvalidInput,
    NotFound,
    ToolFailure,
    Transient,
)
from tools_app.tasks.models import Task, TaskStatus
from tools_app.tasks.state import (
    ACTIVE,
    CHANGES_CHANNEL,
    RUNNABLE,
    enqueue_run,
    expire_lease,
    finished,
    resumable,
    time_allowed,
    transition,
)
from tools_app.toolkit.registry import unstorable_at

if TYPE_CHECKING:
    from datetime import datetime

    from django.contrib.auth.models import AnonymousUser, User

    from tools_app.access import Agent

MANAGE_PERMISSION = "tools_app.manage_task"


# An operator or agent transition re-reads and retries this often when a
# worker changed the task between the read and the UPDATE.
OPTIMISTIC_ROUNDS = 5
# How soon to try again once every round lost: a task moves this fast only between short steps.
LOST_RACE_RETRY_AFTER = 1.0


def get_for_tenant(tenant_id: int, task_id: Any) -> Task:
    """A task of this tenant; another tenant's id is 'not found' like an unknown one."""
    try:
        # With the database's time of the read: what the task's state means now (a lapsed lease) is by its clock.
        task = Task.objects.annotate(read_at=clock.NOW).filter(tenant_id=tenant_id, pk=uuid.UUID(str(task_id))).first()
    except ValueError:
        task = None
    if task is None:
        raise NotFound(f"no task {task_id} in this tenant")
    return task


def _with_retries(task: Task, attempt: Callable[[Task], bool]) -> Task:
    """Read-decide-UPDATE with the version guard; re-read when a worker moved the task meanwhile.

    Every round lost: `transient`, not `in_progress`. Nothing of this call goes on after it answers,
    and under a tool call's key (pause_task, resume_task, cancel_task) a transient failure is one
    the same key runs again after retry_after: `in_progress` would be stored as the key's final
    answer, and every retry with that key would replay "ask again" for the key's whole retention.
    """
    for _ in range(OPTIMISTIC_ROUNDS):
        with transaction.atomic():
            if attempt(task):
                return task
        task.refresh_from_db()
    raise Transient(f"task {task.pk} changed under this call {OPTIMISTIC_ROUNDS} times in a row (its worker is "
                    "moving it on); nothing was changed: retry with the same idempotency_key after retry_after",
                    retry_after=LOST_RACE_RETRY_AFTER, details={"task_status": task.status})


CANCEL = Permit(MANAGE_PERMISSION, "cancel", "manage tasks", "task.cancel_refused", agents=True)


PAUSE = Permit(MANAGE_PERMISSION, "pause", "manage tasks", "task.pause_refused", agents=True)


RESUME = Permit(MANAGE_PERMISSION, "resume", "manage tasks", "task.resume_refused", agents=True)


# Operators only: the agent that met the bug cannot know it was fixed.
MARK_CAUSE_FIXED = Permit(MANAGE_PERMISSION, "mark_cause_fixed", "manage tasks", "task.mark_cause_fixed_refused")


def cancel(task: Task, who: Agent | User | AnonymousUser, *, reason: str = "") -> Task:
    """created|running|paused|retrying -> cancelled, at once, by an operator or the tenant's agent.

    A step still running finds out at its next heartbeat or checkpoint (both
    guarded by the lease this clears) and stops; no further step starts.
    """
    actor = authorize(who, CANCEL, task)

    def attempt(task: Task) -> bool:
        if task.status == TaskStatus.CANCELLED:
            return True
        if task.finished:
            raise AlreadyDone(f"task {task.pk} already {task.status}; nothing to cancel",
                              details={"task_status": task.status})
        return transition(task, {"status__in": ACTIVE}, {
            "status": TaskStatus.CANCELLED, "finished_at": clock.NOW, "lease_owner": "",
            "lease_expires_at": None, "failure_class": "", "pause_requested": "",
            "failure_reason": f"cancelled by {actor}" + (f": {reason}" if reason else ""), "next_retry_at": None,
        }, action="task.cancelled", actor=actor, reason=reason, step=task.current_step) and finished(task, actor)

    return _with_retries(task, attempt)


def pause(task: Task, who: Agent | User | AnonymousUser, *, reason: str) -> Task:
    """created|retrying -> paused at once; running -> paused at its next step boundary.

    A running task's worker is in the middle of a step and only it knows when
    the step's output is safe: so this records the request (`pause_requested`,
    audited, without touching what the worker guards its writes on: status,
    lease, version), and the runner pauses the task after the step's
    checkpoint, or before its first step if it has not begun one. By an
    operator or the tenant's agent; the reason is kept as the pause reason.
    """
    actor = authorize(who, PAUSE, task)
    if not reason.strip():
        raise InvalidInput("reason: say why the task must wait")

    def attempt(task: Task) -> bool:
        if task.status == TaskStatus.PAUSED:
            return True
        if task.status == TaskStatus.RUNNING:
            if task.pause_requested:
                return True
            # No version bump: the worker's next write (a checkpoint) must still go through.
            return db.transition(task, {"status": TaskStatus.RUNNING, "version": task.version}, {
                "pause_requested": reason, "updated_at": clock.NOW,
            }, action="task.pause_requested", actor=actor, reason=reason,
                before={"status": task.status}, after={"status": task.status, "step": task.current_step},
                notify=CHANGES_CHANNEL)
        if task.status not in RUNNABLE:
            raise InvalidInput(f"task {task.pk} is {task.status}; only queued, retrying or running tasks can be "
                               "paused")
        return transition(task, {"status__in": RUNNABLE, "lease_owner": ""}, {
            "status": TaskStatus.PAUSED, "pause_reason": reason, "pause_requested": "", "input_request": None,
            "next_retry_at": None,
        }, action="task.paused", actor=actor, reason=reason)

    return _with_retries(task, attempt)


def resume(task: Task, who: Agent | User | AnonymousUser, *, answer: dict[str, Any] | None = None) -> Task:
    """Continue a task from its last valid checkpoint, where that makes sense:

    paused -> created (with the answer to its input request); retrying -> due now;
    failed with a transient class (its deadline passed, too), or with internal_error once an
    operator marked its cause fixed (mark_cause_fixed) -> created, attempts reset, with as long
    again as it was first given from now (a new deadline); running whose
    worker died -> expire_lease. A queued or healthy running task is left as
    is. Refused: succeeded and cancelled tasks, and deterministic failures
    (with the reason: the input must change, which is a new task). By an
    operator or the tenant's agent.
    """
    actor = authorize(who, RESUME, task)
    return _with_retries(task, lambda task: _resume_attempt(task, actor, answer))


def _resume_attempt(task: Task, actor: str, answer: dict[str, Any] | None) -> bool:
    """One round of resume (see resume): refuse, leave as is, or move the task on."""
    now = clock.read()
    before = task.status
    _refuse_resume(task, now)
    if task.status == TaskStatus.RUNNING:
        return _resume_running(task, now, actor)
    changes = _resume_changes(task, now, answer)
    if changes is None:
        return True  # queued: nothing to do
    if not transition(task, {"status": before}, changes, action="task.resumed", actor=actor,
                      answered=sorted((answer or {}).keys())):
        return False
    if before == TaskStatus.FAILED:
        # Unfinished again: its key answers it again until it ends (the end set a retention).
        engine.hold_while_ongoing(task.record, actor=actor, reason=f"task {task.pk} resumed")
    enqueue_run(task)
    return True


def _refuse_resume(task: Task, now: datetime) -> None:
    """Raise the reason why `task` does not resume, if it does not: it succeeded, was cancelled, or failed
    in a way another run would repeat."""
    match task.status:
        case TaskStatus.SUCCEEDED:
            raise AlreadyDone(f"task {task.pk} already succeeded; get_task_result returns its result",
                              details={"task_status": task.status})
        case TaskStatus.CANCELLED:
            raise AlreadyDone(f"task {task.pk} was cancelled ({task.failure_reason}); a cancelled task does "
                              "not resume: start a new task with a new idempotency_key",
                              details={"task_status": task.status})
        case TaskStatus.FAILED if task.failure_class == ErrorClass.INTERNAL_ERROR and not resumable(task, now):
            raise InternalError(
                f"task {task.pk} failed with an internal error of the server, which another run would repeat "
                f"until it is fixed: {INTERNAL_ERROR_ADVICE}: {task.pk}. resume_task runs it again once an "
                "operator marks the cause fixed.",
                details={"task_status": task.status, "failure_reason": task.failure_reason,
                         "reference": str(task.pk)})
        case TaskStatus.FAILED if not resumable(task, now):
            failure = ToolFailure.from_dict({"class": task.failure_class, "message": (
                f"task {task.pk} failed with a {task.failure_class} error that another run would repeat: "
                f"{task.failure_reason}. Fix the input and start a new task with a new idempotency_key.")})
            raise failure.replaced(details={"task_status": task.status, "failure_reason": task.failure_reason})


def _resume_changes(task: Task, now: datetime, answer: dict[str, Any] | None) -> dict[str, Any] | None:
    """What resuming a failed (resumable), paused or retrying task changes; None for a queued one."""
    match task.status:
        case TaskStatus.FAILED:
            # Run anew, with as long again as it was given (its deadline may be what ended it).
            allowed = task.time_allowed or time_allowed(task.tool)
            return {"status": TaskStatus.CREATED, "attempts": 1, "lease_expiries": 0, "failure_class": "",
                    "failure_reason": "", "finished_at": None, "enqueued_at": now, "cause_fixed_at": None,
                    "time_allowed": allowed, "deadline_at": now + allowed}
        case TaskStatus.PAUSED:
            answered = personal.sealing(_checked_answer(task, answer), task.tenant_id, timedelta(0))
            return {"status": TaskStatus.CREATED, "resume_input": answered,
                    "pause_reason": "", "pause_requested": "", "enqueued_at": now}
        case TaskStatus.RETRYING:
            return {"next_retry_at": now, "enqueued_at": now}
    return None


def _resume_running(task: Task, now: datetime, actor: str) -> bool:
    """Resuming a running task: its worker died (the lease ran out), or a pause it was asked for is withdrawn;
    a healthy one is left as is."""
    if task.lease_expires_at and task.lease_expires_at < now:
        return expire_lease(task, actor=actor)
    if task.pause_requested:
        # Not paused yet: resuming withdraws the request, and the worker carries on.
        return db.transition(task, {"status": TaskStatus.RUNNING, "version": task.version,
                                    "pause_requested": task.pause_requested},
                             {"pause_requested": "", "updated_at": now},
                             action="task.pause_withdrawn", actor=actor, before={"status": task.status},
                             after={"status": task.status}, notify=CHANGES_CHANNEL)
    return True  # running: nothing to do


def mark_cause_fixed(task: Task, who: Agent | User | AnonymousUser, *, reason: str) -> Task:
    """failed with internal_error -> the same, marked fixed: resume_task may then run it again (once:
    resuming clears the mark). By an operator, saying what was fixed (e.g. the release)."""
    actor = authorize(who, MARK_CAUSE_FIXED, task)
    if not reason.strip():
        raise InvalidInput("reason: say what was fixed (e.g. the release that fixes it)")

    def attempt(task: Task) -> bool:
        if task.status != TaskStatus.FAILED or task.failure_class != ErrorClass.INTERNAL_ERROR:
            raise InvalidInput(f"task {task.pk} is {task.status}"
                               + (f" ({task.failure_class})" if task.failure_class else "")
                               + "; only a task failed with internal_error has a cause to mark fixed")
        if task.cause_fixed_at is not None:
            return True
        return transition(task, {"status": TaskStatus.FAILED, "failure_class": ErrorClass.INTERNAL_ERROR,
                                 "cause_fixed_at__isnull": True},
                          {"cause_fixed_at": clock.NOW}, action="task.cause_fixed", actor=actor, reason=reason)

    return _with_retries(task, attempt)


def _checked_answer(task: Task, answer: dict[str, Any] | None) -> dict[str, Any] | None:
    """Answers must be to what the paused step asked, in the shape it asked for."""
    if not answer:
        return None
    requested = task.input_request or {}
    unknown = sorted(set(answer) - set(requested))
    if unknown:
        raise InvalidInput(f"task {task.pk} did not ask for {', '.join(unknown)}"
                           + (f"; it asks for {', '.join(sorted(requested))}" if requested else ""))
    if (where := unstorable_at(answer)) is not None:  # resume_task's arguments were checked; tasks/update's not
        raise InvalidInput(f"input: contains a character that cannot be stored at {where} (NUL, U+0000)")
    for key, value in answer.items():
        try:
            jsonschema.validate(value, requested[key].get("schema", {}))
        except jsonschema.ValidationError as exc:
            raise InvalidInput(f"input {key!r} does not match what the task asked for: {exc.message}") from None
    return answer
