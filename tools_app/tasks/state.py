"""The long-task state machine. Every transition is one function here.

```
created ──take──▶ running ──begin_step, complete_step…──▶ running ──succeed──▶ succeeded
   ▲                 │ ├─begin_compensation (a saga's step failed for good) ─▶ running: compensations…──fail──▶ failed
   ▲                 │ ├─fail (final error, attempts used up)────▶ failed
   │                 │ ├─retry_later (transient error)──▶ retrying ──take (when due)──▶ running
   │                 │ ├─pause_for_input (step waits)───▶ paused ──resume──▶ created
   │                 │ ├─pause_at_boundary (asked to)───▶ paused
   │                 │ ├─park (a durable wait)──────────▶ paused ──wake (event, or its time)──▶ created
   │                 │ └─hand_on (slice used up)────────▶ created
   └──expire_lease (worker died: sweep, resume_task)──┘
created|running|paused|retrying ──cancel──▶ cancelled
created|running|paused|retrying ──end_at_deadline (its deadline passed: sweep, runner)──▶ failed
```

Each function is a conditional UPDATE guarded by what it expects (status,
lease owner, version), plus its audit event, in one statement (`transition`,
a thin wrapper of core.db.transition); a count of 0 means someone else
changed the task first and nothing was written. The lease is the only guard
against two workers running one task: django-q2 delivers jobs at least once
(a killed worker's job comes back after `retry`, and a job waiting longer than
`retry` is delivered twice), so a job that cannot take the lease simply ends.

Every task has a deadline (`deadline_at`: its start plus `time_allowed`, the long tool's
deadline or the shorter one its caller asked for). One not done by then ends, failed with the
reason (`end_at_deadline`), whatever it is doing: the sweep ends it, and so does its own worker
at a step boundary. So a task nobody finishes (a pause nobody answers, a worker that hangs)
never holds its key forever: the end starts the key's retention, as any end does (`finished`).

Workers hold the lease while the task is `running` (a check constraint
keeps the two together) and renew it while a step runs (`renew_lease`).
Lease expiries and retry times are the database's (core.clock), never a
worker's clock.

Every transition also notifies CHANGES_CHANNEL with the task's id, in its
statement (delivered at commit): the web processes' watchers (tools_app.mcp)
push the new status to clients that wait or listen. A task that finishes
with a `notify_url` writes its webhook into the outbox in the transaction of
that last transition (`finished`).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from functools import cache
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connection, transaction
from django.db.models import BooleanField, ExpressionWrapper, Q

from tools_app import engine
from tools_app.conf import conf
from tools_app.core import audit, clock, counters, db, instances, jobs, leases, personal
from tools_app.core.errors import ErrorClass, NotFound, ToolFailure
from tools_app.engine.models import IdempotencyRecord
from tools_app.tasks import checkpoints
from tools_app.tasks.hooks import hooks
from tools_app.tasks.models import StepOutcome, StepRun, Task, TaskStatus
from tools_app.toolkit import pipelines
from tools_app.toolkit.pipelines import Step
from tools_app.toolkit.registry import get_tool

logger = logging.getLogger(__name__)

TASK_SWEEPER = "system:task-sweep"
ACTIVE = (TaskStatus.CREATED, TaskStatus.RUNNING, TaskStatus.PAUSED, TaskStatus.RETRYING)
RUNNABLE = (TaskStatus.CREATED, TaskStatus.RETRYING)
# The PostgreSQL channel that hears a task's id whenever it changes.
CHANGES_CHANNEL = "idemops_tasks"
WEBHOOK_KIND = "task.webhook"


def lease_seconds() -> float:
    return conf().task_lease_seconds


def transition(task: Task, expected: dict[str, Any], changes: dict[str, Any], *, action: str, actor: str,
               reason: str = "", **after: Any) -> bool:
    """core.db.transition for a task: also guarded by the version read (and `expected`), which it
    bumps; the event records the status before and after, and `after` adds to the after-state."""
    return moved(task, expected, changes, action=action, actor=actor, reason=reason, **after) is not None


def moved(task: Task, expected: dict[str, Any], changes: dict[str, Any], *, action: str, actor: str,
          reason: str = "", together: tuple[db.Together, ...] = (), **after: Any) -> tuple[Any, ...] | None:
    """`transition` with writes that go with it in its statement (core.db.Together): None if the task
    did not move, else what those writes returned."""
    return db.transition_returning(
        task, {"version": task.version, **expected},
        {**changes, "version": task.version + 1, "updated_at": clock.NOW},
        action=action, actor=actor, reason=reason, before={"status": task.status},
        after={"status": changes.get("status", task.status), **after}, notify=CHANGES_CHANNEL, together=together)


def enqueue_run(task: Task) -> None:
    """Queue a job for the task. The ORM broker joins the caller's transaction:
    if the transition rolls back, so does the job."""
    # save=False: the Task row is the record of a run; django-q2 still keeps failed jobs (a bug in a runner).
    jobs.enqueue("tasks.run_task", str(task.pk), task_name=job_name(task), group=f"task:{task.tool}", save=False)


def job_name(task: Task) -> str:
    return f"task-{task.pk}"


# --- creation ---------------------------------------------------------------------------


@transaction.atomic
def create_task(*, record: IdempotencyRecord, tool: str, arguments: dict[str, Any], input_digest: str,
                steps_total: int, max_attempts: int, actor: str, trace_id: str = "", span_id: str = "",
                sealed_arguments: str = "", notify_url: str = "", deadline: timedelta | None = None,
                **more: Any) -> Task:
    """-> created, and queued. Runs inside the idempotency transaction of the operation that
    creates it (start_task, or a fork: `more` then links it to the original).

    The one-to-one `record` makes a second task for the same operation a
    unique violation, whatever the engine above did. It must end by its tool's
    deadline, or by `deadline` if its caller asked for less (Pipeline.time_allowed).
    """
    now = clock.read()
    allowed = time_allowed(tool, deadline)
    more.update(time_allowed=allowed, deadline_at=now + allowed)
    # The pipeline version it starts on, and keeps (tools_app.tasks.versions).
    more.setdefault("pipeline_version", pipeline_version(tool))
    task = Task.objects.create(
        tenant_id=record.tenant_id, tool=tool, record=record, operation_id=record.operation_id, arguments=arguments,
        input_digest=input_digest,
        sealed_arguments=sealed_arguments, steps_total=steps_total, max_attempts=max_attempts, actor=actor,
        trace_id=trace_id, span_id=span_id, notify_url=notify_url, enqueued_at=now, created_at=now, updated_at=now,
        **more)
    audit.record_event(action="task.created", obj=task, actor=actor, trace_id=trace_id,
                       after={"status": task.status, "tool": tool, **({"notify_url": True} if notify_url else {})})
    # The call answers at once, but its key must answer this task until the task ends, however long
    # that takes (a paused task may wait for days): a key that expired meanwhile would start a second.
    engine.hold_while_ongoing(record, actor=actor, reason=f"task {task.pk} started")
    enqueue_run(task)
    return task


# --- the worker's transitions (guarded by the lease) ------------------------------------------


def take(task_id: str, owner: str) -> Task | None:
    """created|retrying (due, no live lease) -> running, held by `owner`. None: not ours to run.
    (No transaction around the read and the move: the move is guarded by the version read.)"""
    found = _with_record(uuid.UUID(str(task_id)))
    if found is None:
        return None
    task, read_at = found
    if task.status not in RUNNABLE or (task.next_retry_at and task.next_retry_at > read_at):
        return None
    if not transition(task, {"status__in": RUNNABLE}, {
        "status": TaskStatus.RUNNING, "lease_owner": owner, "lease_expires_at": leases.expiry(lease_seconds()),
        "next_retry_at": None, "waiting_until": None,
    }, action="task.taken", actor=owner, attempt=task.attempts):
        return None  # another worker took it (or it was cancelled) since we read it
    return task


def _with_record(task_id: uuid.UUID) -> tuple[Task, datetime] | None:
    """The task with its idempotency record, and the database's clock, in one read (the statement built
    once: the ORM would compile it on every take)."""
    row = db.fetchone(_with_record_sql(), [task_id])
    if row is None:
        return None
    split = len(db.select_columns(Task)[0])
    task = db.from_row(Task, row[:split])
    task.record = db.from_row(IdempotencyRecord, row[split:-1])
    return task, row[-1]


@cache
def _with_record_sql() -> str:
    _, task_columns = db.select_columns(Task, "t")
    _, record_columns = db.select_columns(IdempotencyRecord, "r")
    return (f"SELECT {task_columns}, {record_columns}, STATEMENT_TIMESTAMP() FROM {db.table(Task)} t "
            f"JOIN {db.table(IdempotencyRecord)} r ON r.id = t.record_id WHERE t.id = %s")


def begin_step(task: Task, owner: str, step: Step, sequence: int, completed: list[str]) -> StepRun | None:
    """Start the first step of a run, if the task is still ours and running, no pause was asked for
    and its deadline has not passed (one statement: the task's move, its audit event and the step's
    StepRun). None: it did not start (`at_boundary` says whether the boundary stopped it).

    `completed` are the steps whose checkpoints this run verified: a rejected
    checkpoint's step no longer counts as done.
    """
    starts, made = _step_run_starts(task, owner, step, sequence)
    started = moved(task, {"status": TaskStatus.RUNNING, "lease_owner": owner, **_boundary_clear(task)},
                    {**_step_changes(step), "completed_steps": completed},
                    action="task.step_started", actor=owner, step=step.name, together=(starts,))
    return None if started is None else made(started[-1])


def _boundary_clear(task: Task) -> dict[str, Any]:
    """What a transition expects of a task for its next step to start: no pause asked for, its deadline not
    passed (by the database's clock). The task's version guards the deadline read with it."""
    return {"pause_requested": "",
            **({"deadline_at__gte": clock.NOW} if task.deadline_at is not None else {"deadline_at": None})}


def _step_changes(step: Step) -> dict[str, Any]:
    return {"current_step": step.name, "lease_expires_at": leases.expiry(lease_seconds()),
            "progress_done": None, "progress_total": None, "progress_message": ""}


def _step_run_starts(task: Task, owner: str, step: Step, sequence: int, attempt: int | None = None
                     ) -> tuple[db.Together, Callable[[int], StepRun]]:
    """The INSERT of a step's StepRun that goes with a task's transition (in the task's attempt, or
    `attempt`), and what makes the StepRun of the id it returns (its `started_at`, the database's
    clock, is read from the row when asked for)."""
    run = instances.unsaved(StepRun, {"task": task}, step=step.name, sequence=sequence,
                            attempt=attempt or task.attempts, worker=owner, started_at=clock.NOW,
                            trace_id=task.trace_id)
    columns, values, params, _ = db.insert_parts(run)
    insert = db.Together(f"INSERT INTO {db.table(StepRun)} ({', '.join(columns)}) SELECT {', '.join(values)} "
                         "FROM changed RETURNING id", params, returns=True)

    def made(pk: int) -> StepRun:
        run.pk = pk
        run._state.adding, run._state.db = False, DEFAULT_DB_ALIAS
        vars(run).pop("started_at")  # deferred: Django reads it from the row if asked
        return run

    return insert, made


def _step_run_ends(run: StepRun, outcome: StepOutcome, error: str = "") -> db.Together:
    """finish_step_run, as a write that goes with a task's transition."""
    return db.Together(_FINISH_STEP_RUN + " AND EXISTS (SELECT FROM changed)", (outcome, error[:2000], run.pk))


def renew_lease(task_id: uuid.UUID, owner: str, progress: tuple[float | None, float | None, str] | None = None,
                announce: bool = False) -> bool:
    """Extend our lease (and record progress). False: cancelled, or the lease is no longer ours.

    Liveness, not a state change: no version bump and no audit event. `announce`:
    the progress moved, so tell the watchers (CHANGES_CHANNEL) as a transition does.
    """
    changes: dict[str, Any] = {"lease_expires_at": leases.expiry(lease_seconds())}
    if progress is not None:
        done, total, message = progress
        changes.update(progress_done=done, progress_total=total, progress_message=(message or "")[:300])
    renewed = bool(Task.objects.filter(pk=task_id, status=TaskStatus.RUNNING, lease_owner=owner).update(**changes))
    if renewed and announce:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", [CHANGES_CHANNEL, str(task_id)])
    return renewed


@dataclass(frozen=True)
class Advanced:
    """What moving a running task past a finished step answers."""

    moved: bool  # False: the lease is gone (cancelled, or taken), nothing was written
    next_run: StepRun | None = None  # the StepRun of the step it moved to; None when no step follows
    # Why it did not go on to the step it was told to: a pause was asked for, or its deadline passed.
    boundary: Boundary | None = None


def complete_step(task: Task, owner: str, prepared: checkpoints.Prepared, run: StepRun,
                  then: tuple[Step, int] | None = None) -> Advanced:
    """Advance past a finished step, in one statement: the task's move and its audit event, the step's
    checkpoint, its StepRun closed and the StepRun of step `then` begun.

    Guarded by the lease: a task cancelled while the step was finishing keeps
    no output from it, and its next step never starts. Going on to `then` is also
    guarded by the boundary (no pause asked for, the deadline not passed): where it is
    not clear, the task moves past the step without starting `then`, and `boundary` says why.
    """
    if then is None:
        return _complete_step(task, owner, prepared, run, None, {})
    advanced = _complete_step(task, owner, prepared, run, then, _boundary_clear(task))
    if advanced.moved:
        return advanced
    boundary = at_boundary(task.pk)
    if not boundary.pause and not boundary.past_deadline:
        return advanced  # not the boundary: the lease is gone
    return replace(_complete_step(task, owner, prepared, run, None, {}), boundary=boundary)


def _complete_step(task: Task, owner: str, prepared: checkpoints.Prepared, run: StepRun,
                   then: tuple[Step, int] | None, expected: dict[str, Any]) -> Advanced:
    completed = [name for name in task.completed_steps if name != prepared.step.name] + [prepared.step.name]
    # The finished step's own progress goes with it: left behind, it would count that step a second
    # time (tasks.agent_view.overall_progress) until the next step starts or the task ends.
    changes = {"completed_steps": completed, "lease_expires_at": leases.expiry(lease_seconds()),
               "progress_done": None, "progress_total": None, "progress_message": ""}
    together = [_step_run_ends(run, StepOutcome.SUCCEEDED)]
    if then is not None:
        changes.update(_step_changes(then[0]))
        starts, made = _step_run_starts(task, owner, *then)
        together.append(starts)
    with checkpoints.writes(task, prepared) as writes:
        done = moved(task, {"status": TaskStatus.RUNNING, "lease_owner": owner, **expected}, changes,
                     action="task.step_completed", actor=owner, step=prepared.step.name,
                     checksum=prepared.checksum, next_step=then[0].name if then else None,
                     together=(*writes, *together))
    if done is None:
        return Advanced(moved=False)
    return Advanced(moved=True, next_run=made(done[-1]) if then is not None else None)


def begin_compensation(task: Task, owner: str, marker: checkpoints.Prepared, run: StepRun, failure: ToolFailure,
                       then: tuple[Step, int], steps_total: int) -> Advanced:
    """running: a saga's step failed for good -> its compensations start (the task stays running).

    One statement: the failure marker's checkpoint (so a resumed task goes on
    compensating, never forward), the failed StepRun, and the first compensation's
    start; guarded by the lease like complete_step.
    """
    completed = [*task.completed_steps, marker.step.name]
    changes = {"completed_steps": completed, "lease_expires_at": leases.expiry(lease_seconds()),
               # The compensations get a retry budget of their own: the forward run may have used it up.
               "steps_total": steps_total, "attempts": 1, "failure_class": str(failure.error_class),
               "failure_reason": failure.message, **_step_changes(then[0])}
    # The first compensation's StepRun counts the compensations' attempts: the task's are 1 once moved.
    starts, made = _step_run_starts(task, owner, *then, attempt=1)
    with checkpoints.writes(task, marker) as writes:
        done = moved(task, {"status": TaskStatus.RUNNING, "lease_owner": owner}, changes,
                     action="task.compensating", actor=owner, reason=failure.message,
                     failed_step=task.current_step, failure_class=str(failure.error_class),
                     next_step=then[0].name,
                     together=(*writes, _step_run_ends(run, StepOutcome.FAILED, failure.message), starts))
    if done is None:
        return Advanced(moved=False)
    return Advanced(moved=True, next_run=made(done[-1]))


_FINISH_STEP_RUN = (f"UPDATE {StepRun._meta.db_table} SET outcome = %s, error = %s, "
                    "finished_at = STATEMENT_TIMESTAMP() WHERE id = %s")


def finish_step_run(run: StepRun, outcome: StepOutcome, error: str = "") -> None:
    """Close a StepRun history row (not task state: written even after a cancel). The statement
    `_step_run_ends` puts in a task's transition, on its own."""
    db.fetchone(_FINISH_STEP_RUN + " RETURNING id", (outcome, error[:2000], run.pk))


def succeed(task: Task, owner: str, result: dict[str, Any]) -> bool:
    """running -> succeeded, storing the tool's result; what follows an end (`finished`) in the same
    statement: the key's retention from now (engine.retention_from_end_with), and in its transaction
    the webhook, if the caller asked for one."""
    retained = engine.retention_from_end_with(task.record, key_retention(task.tool), actor=owner,
                                              reason=f"task {task.pk} {TaskStatus.SUCCEEDED}")
    with transaction.atomic() if task.notify_url else nullcontext():
        ended = moved(task, {"status": TaskStatus.RUNNING, "lease_owner": owner}, {
            "status": TaskStatus.SUCCEEDED, "result": derived_sealing(task, result),
            "current_step": "", "finished_at": clock.NOW,
            "lease_owner": "", "lease_expires_at": None, "failure_class": "", "failure_reason": "",
            "progress_done": task.steps_total, "progress_total": task.steps_total, "progress_message": "done",
            "pause_requested": "",
        }, action="task.succeeded", actor=owner, together=retained.writes)
        if ended is None:
            return False
        retained.applied(ended[0])
        _notify_caller(task)
    return True


@transaction.atomic
def fail(task: Task, owner: str, failure: ToolFailure, run: StepRun | None = None) -> bool:
    """running -> failed: a final error, or a transient one with no attempts left."""
    if not transition(task, {"status": TaskStatus.RUNNING, "lease_owner": owner}, {
        "status": TaskStatus.FAILED, "failure_class": str(failure.error_class), "failure_reason": failure.message,
        "finished_at": clock.NOW, "lease_owner": "", "lease_expires_at": None, "pause_requested": "",
    }, action="task.failed", actor=owner, failure_class=str(failure.error_class)):
        return False
    finished(task, owner)
    if run is not None:
        finish_step_run(run, StepOutcome.FAILED, failure.message)
    return True


@transaction.atomic
def retry_later(task: Task, owner: str, failure: ToolFailure, delay: float, *, waited_by_worker: bool,
                run: StepRun | None = None, counted: bool = True) -> bool:
    """running -> retrying: a transient error; the next attempt is due after `delay` seconds.
    Not `counted` (a pause, an open breaker: core.errors.Held): the attempt is not spent.

    `waited_by_worker`: this job sleeps until then and takes the task again;
    otherwise no job is queued and the sweep queues one once it is due.
    """
    if not transition(task, {"status": TaskStatus.RUNNING, "lease_owner": owner}, {
        "status": TaskStatus.RETRYING, "attempts": task.attempts + int(counted), "next_retry_at": clock.later(delay),
        "failure_class": str(failure.error_class), "failure_reason": failure.message,
        "lease_owner": "", "lease_expires_at": None, "enqueued_at": clock.NOW if waited_by_worker else None,
    }, action="task.retry_scheduled", actor=owner, attempt=task.attempts + int(counted),
            retry_in_seconds=round(delay, 3), failure_class=str(failure.error_class)):
        return False
    if run is not None:
        finish_step_run(run, StepOutcome.FAILED, failure.message)
    return True


@transaction.atomic
def pause_for_input(task: Task, owner: str, reason: str, input_request: dict[str, Any] | None,
                    run: StepRun | None = None) -> bool:
    """running -> paused: a step waits for a person or a dependency."""
    if not transition(task, {"status": TaskStatus.RUNNING, "lease_owner": owner}, {
        "status": TaskStatus.PAUSED, "pause_reason": reason,
        "input_request": personal.sealing(input_request, task.tenant_id, timedelta(0)), "resume_input": None,
        "lease_owner": "", "lease_expires_at": None,
    }, action="task.paused", actor=owner, reason=reason, step=task.current_step):
        return False
    if run is not None:
        finish_step_run(run, StepOutcome.PAUSED, reason)
    return True


@transaction.atomic
def park(task: Task, owner: str, reason: str, until: datetime, run: StepRun | None = None) -> bool:
    """running -> paused in a durable wait (tools_app.tasks.waits): no lease, no worker; `wake` (the event
    arrived, or the sweep found `until` passed) queues it again, and its step runs again from its start."""
    if not transition(task, {"status": TaskStatus.RUNNING, "lease_owner": owner}, {
        "status": TaskStatus.PAUSED, "pause_reason": reason, "input_request": None, "resume_input": None,
        "waiting_until": until, "lease_owner": "", "lease_expires_at": None,
    }, action="task.waiting", actor=owner, reason=reason, step=task.current_step, until=until.isoformat()):
        return False
    if run is not None:
        finish_step_run(run, StepOutcome.PAUSED, reason)
    return True


@transaction.atomic
def wake(task: Task, actor: str, reason: str) -> bool:
    """paused in a durable wait -> created, queued: the event arrived or the wait's time came."""
    if not transition(task, {"status": TaskStatus.PAUSED, "waiting_until__isnull": False}, {
        "status": TaskStatus.CREATED, "pause_reason": "", "waiting_until": None, "enqueued_at": clock.NOW,
    }, action="task.woken", actor=actor, reason=reason):
        return False
    enqueue_run(task)
    return True


@dataclass(frozen=True)
class Boundary:
    """What the runner reads between two steps (one query)."""

    pause: str  # the reason a running task was asked to pause with, or ""
    past_deadline: bool  # its deadline has passed, by the database's clock


def at_boundary(task_id: uuid.UUID) -> Boundary:
    row = Task.objects.filter(pk=task_id).values_list("pause_requested", ExpressionWrapper(
        Q(deadline_at__lt=clock.NOW), output_field=BooleanField())).first()
    return Boundary(pause=row[0] or "", past_deadline=bool(row[1])) if row else Boundary("", False)


def pause_at_boundary(task: Task, owner: str, reason: str, next_step: Step) -> bool:
    """running -> paused between two steps, as someone asked (control.pause): nothing runs until
    resumed, and the next run starts at `next_step` (its checkpoints are all there)."""
    return transition(task, {"status": TaskStatus.RUNNING, "lease_owner": owner}, {
        "status": TaskStatus.PAUSED, "pause_reason": reason, "pause_requested": "", "input_request": None,
        "resume_input": None, "current_step": next_step.name, "progress_done": None, "progress_total": None,
        "progress_message": "", "lease_owner": "", "lease_expires_at": None,
    }, action="task.paused", actor=owner, reason=reason, step=next_step.name, at_boundary=True)


@transaction.atomic
def hand_on(task: Task, owner: str) -> bool:
    """running -> created, queued again: this job ran long enough; a fresh one continues
    from the checkpoints (keeps every job well inside django-q2's timeout)."""
    if not transition(task, {"status": TaskStatus.RUNNING, "lease_owner": owner}, {
        "status": TaskStatus.CREATED, "lease_owner": "", "lease_expires_at": None, "enqueued_at": clock.NOW,
    }, action="task.handed_on", actor=owner):
        return False
    enqueue_run(task)
    return True


# --- the deadline: no task holds its key forever ----------------------------------------------


@transaction.atomic
def end_at_deadline(task: Task, actor: str = TASK_SWEEPER) -> bool:
    """created|running|paused|retrying, past its deadline -> failed (transient), with the reason.

    Guarded by the deadline itself (by the database's clock) and the version read: a task that
    finished, or that resume_task gave a new deadline, since it was read is left alone. A step still
    running finds out at its next heartbeat (the lease is cleared) and stops, writing nothing more.
    `transient`: another run might finish in time, so resume_task runs it again from its last
    checkpoint, with as long again from then; the key's retention counts from this end meanwhile.
    """
    allowed = task.time_allowed or time_allowed(task.tool)
    where = f" at step {task.current_step!r}" if task.current_step else ""
    until = f" (until {task.deadline_at:%Y-%m-%dT%H:%M:%SZ})" if task.deadline_at else ""
    reason = (f"its deadline passed before it finished: it was given {_duration(allowed)}{until} and was still "
              f"{task.status}{where}; resume_task runs it again from its last checkpoint, with as long again")
    if not transition(task, {"status__in": ACTIVE, "deadline_at__lt": clock.NOW}, {
        "status": TaskStatus.FAILED, "failure_class": ErrorClass.TRANSIENT, "failure_reason": reason,
        "finished_at": clock.NOW, "lease_owner": "", "lease_expires_at": None, "pause_requested": "",
        "next_retry_at": None,
    }, action="task.deadline_passed", actor=actor, reason=reason, failure_class=ErrorClass.TRANSIENT,
            step=task.current_step, deadline_at=task.deadline_at.isoformat() if task.deadline_at else None):
        return False
    return finished(task, actor)


def past_deadline() -> list[Task]:
    """The unfinished tasks whose deadline has passed (the sweep ends them), without their arguments."""
    return list(Task.objects.filter(status__in=ACTIVE, deadline_at__lt=clock.NOW).select_related("record")
                .defer("arguments", "sealed_arguments", "result").order_by("deadline_at", "pk"))


def _duration(allowed: timedelta) -> str:
    seconds = allowed.total_seconds()
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g} {unit}"
    return f"{seconds:g} s"


# --- expiry: the worker died ---------------------------------------------------------------


@transaction.atomic
def expire_lease(task: Task, actor: str = TASK_SWEEPER) -> bool:
    """running with an expired lease -> created and queued (or failed after too many deaths).

    Guarded by the expired lease itself (by the database's clock): a worker that renewed in time keeps it.
    """
    now = clock.NOW
    deaths = task.lease_expiries + 1
    expected = {"status": TaskStatus.RUNNING, "lease_owner": task.lease_owner, "lease_expires_at__lt": now}
    if deaths >= conf().task_max_lease_expiries:
        reason = (f"the worker running step {task.current_step!r} died {deaths} times; "
                  "resume_task runs it again if the cause is fixed")
        expired = transition(task, expected, {
            "status": TaskStatus.FAILED, "lease_expiries": deaths, "failure_class": ErrorClass.TRANSIENT,
            "failure_reason": reason, "finished_at": now, "lease_owner": "", "lease_expires_at": None,
            "pause_requested": "",
        }, action="task.failed", actor=actor, reason=reason,
            failure_class=ErrorClass.TRANSIENT) and finished(task, actor)
    else:
        expired = transition(task, expected, {
            "status": TaskStatus.CREATED, "lease_expiries": deaths, "lease_owner": "", "lease_expires_at": None,
            "enqueued_at": now,
        }, action="task.lease_expired", actor=actor, step=task.current_step, lease_expiries=deaths)
        if expired:
            enqueue_run(task)
    if expired:  # counted when this transaction commits (core.counters)
        counters.count(counters.TASK_LEASE_EXPIRY, tool=task.tool, tenant_id=task.tenant_id)
    return expired


def lost_job_after() -> float:
    """Seconds a task may sit queued before its job counts as lost: the job's worker takes the task
    at once, so after a lease's worth (and the grace IDEMOPS_TASK_REQUEUE_AFTER_SECONDS) a task
    that is still waiting has no job coming unless the queue still holds one for it."""
    return lease_seconds() + conf().task_requeue_after_seconds


def waiting_for_a_job() -> Q:
    """Runnable tasks that may have no job coming: queued a while ago, or due retries (by the
    database's clock) that no worker is waiting out or whose worker should have taken them by now."""
    now = clock.NOW
    stale = now - timedelta(seconds=lost_job_after())
    overdue = now - timedelta(seconds=conf().task_requeue_after_seconds)
    return (Q(status=TaskStatus.CREATED, enqueued_at__lt=stale)
            | Q(status=TaskStatus.RETRYING, next_retry_at__lte=now, enqueued_at__isnull=True)
            | Q(status=TaskStatus.RETRYING, next_retry_at__lt=overdue, enqueued_at__lt=stale))


def without_a_job() -> list[Task]:
    """The runnable tasks no job will pick up: those of `waiting_for_a_job` whose job the queue no
    longer holds for a worker (core.jobs.live): a job that failed without taking the task (its worker
    lost the database), or one taken by a cluster that died before a worker took the task. A task
    still waiting its turn in a long queue is not one of them: it is never queued twice for waiting."""
    candidates = list(Task.objects.filter(waiting_for_a_job()).order_by("pk"))
    queued = [task for task in candidates if task.enqueued_at is not None]
    held = jobs.live([job_name(task) for task in queued], taken_within=lost_job_after())
    return [task for task in candidates if job_name(task) not in held]


@transaction.atomic
def requeue(task: Task, actor: str = TASK_SWEEPER) -> bool:
    """A runnable task that no job will take (as the sweep read it): queue it again.

    The version guard is enough: any change since the read bumped it."""
    lost = task.enqueued_at is not None  # a due retry without one was never queued: nothing was lost
    if not transition(task, {}, {"enqueued_at": clock.NOW}, action="task.requeued", actor=actor,
                      job_lost=lost):
        return False
    enqueue_run(task)
    if lost:
        counters.count(counters.TASK_JOB_LOST, tool=task.tool, tenant_id=task.tenant_id)
    return True


def finished(task: Task, actor: str) -> bool:
    """What follows a transition to succeeded, failed or cancelled, in its transaction: the key
    that started the task is kept for the long tool's retention from now (not from the start:
    engine.retain_from_end), and the webhook the caller asked for (`notify_url`), through the
    outbox, which delivers it at least once with the event id (X-Event-Id) for the receiver to
    deduplicate by."""
    engine.retain_from_end(task.record, key_retention(task.tool), actor=actor, reason=f"task {task.pk} {task.status}")
    _notify_caller(task)
    return True


def _notify_caller(task: Task) -> None:
    """The webhook the caller asked for (`notify_url`), if any, through the outbox (in the caller's transaction)."""
    if task.notify_url:
        hooks.enqueue_event(tenant_id=task.tenant_id, kind=WEBHOOK_KIND, record=task.record,
                            payload=derived_sealing(task, {"recipient": task.notify_url, "json": webhook_body(task)}))


def derived_sealing(task: Task, value: Any) -> Any:
    """A value a task of a tool with personal arguments derived from them (its result, its webhook), stored as one
    envelope (core.personal.sealing_whole); otherwise its personal names sealed (core.personal.sealing)."""
    if checkpoints.declares_personal(task.tool):
        return personal.sealing_whole(value, task.tenant_id)
    return personal.sealing(value, task.tenant_id, timedelta(0))


def time_allowed(tool: str, requested: timedelta | None = None) -> timedelta:
    """How long a task of `tool` may take: its pipeline's deadline, or `requested` if shorter (a tool
    no longer declared: IDEMOPS_TASK_DEADLINE_SECONDS)."""
    try:
        declared = get_tool(tool).pipeline.deadline
    except NotFound:
        declared = None
    return pipelines.time_allowed(declared, requested)


def pipeline_version(tool: str) -> int:
    """The version of `tool`'s pipeline this code declares (a tool no longer declared: 1)."""
    try:
        pipeline = get_tool(tool).pipeline
    except NotFound:
        return 1
    return pipeline.version if pipeline is not None else 1


def key_retention(tool: str) -> timedelta:
    """How long the key of a task of `tool` answers its task once the task has ended: the long
    tool's own retention (a tool no longer declared: the engine's default)."""
    try:
        return get_tool(tool).retention_now()
    except NotFound:
        return engine.DEFAULT_RETENTION


def webhook_body(task: Task) -> dict[str, Any]:
    return {"type": "task.finished", "task_id": str(task.pk), "tool": task.tool, "status": task.status,
            "failure_class": task.failure_class or None, "failure_reason": task.failure_reason or None,
            "result": task.result if task.status == TaskStatus.SUCCEEDED else None,
            "forked_from": str(task.forked_from_id) if task.forked_from_id else None,
            "finished_at": task.finished_at.isoformat() if task.finished_at else None}


def resumable(task: Task, now: datetime | None = None) -> bool:
    """Whether resume_task would run the task again (from its last valid checkpoint). A running
    task's lease is compared with `now`, else the database's time of the read."""
    return (task.status in (TaskStatus.PAUSED, TaskStatus.RETRYING)
            or (task.status == TaskStatus.FAILED and task.failure_class == ErrorClass.TRANSIENT)
            # A bug fails the same way on every run: only once an operator says it is fixed.
            or (task.status == TaskStatus.FAILED and task.failure_class == ErrorClass.INTERNAL_ERROR
                and task.cause_fixed_at is not None)
            or (task.status == TaskStatus.RUNNING and task.lease_expires_at is not None
                and task.lease_expires_at < (now or clock.read_at(task))))


