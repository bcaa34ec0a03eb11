"""Long tools as agents see them: starting a task, its status, waiting for it.

`start` is start_task's handler: it runs inside the idempotency engine's
transaction, so the same key and arguments always answer with the same task
and other arguments are a `conflict`. Calling a long tool directly
(`ingest_document` itself) is the same operation as start_task for it, and
then waits a bounded time for the task: the caller gets the result if the
task finishes in time, or `in_progress` with the task id (calling again with
the same key waits again).

A long tool's call starts in one pass (`begin`): its arguments are validated
once, the engine runs it as start_task's operation, and the task comes back
as a value; waiting for it is a value too (core.polling.Pending).

A caller may ask for a shorter deadline than the long tool's (MCP tasks at
2025-11-25: the `ttl` of tools/call's `task`): `begin(..., deadline=)` hands
it to the task the call creates. It is no argument of the operation: a retry
with the same key answers the same task, whatever it asks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from pydantic import BaseModel, Field

from tools_app import access
from tools_app.conf import conf
from tools_app.core import clock, db, keys, polling, redaction, url_allowlist
from tools_app.core.errors import (
    AlreadyDone,
    ErrorClass,
    InProgress,
    InternalError,
    InvalidInput,
    NotFound,
    ToolFailure,
)
from tools_app.core.keys import FINGERPRINT_FILLED
from tools_app.tasks import state
from tools_app.tasks.models import Task, TaskStatus
from tools_app.toolkit.calls import (
    Caller,
    CallResult,
    checked_arguments,
    run_write,
    validate_arguments,
    with_idempotency_key,
)
from tools_app.toolkit.registry import ENGINE_FIELDS, ToolContext, ToolSpec, all_tools, get_tool

START_TASK = "start_task"


# --- what an agent sees -----------------------------------------------------------------------


class TaskHandle(BaseModel):
    task_id: str
    tool: str
    created_at: datetime
    next_action: str = Field(description="What to do next.")


class Progress(BaseModel):
    done: float | None
    total: float | None
    message: str


class TaskStatusView(BaseModel):
    task_id: str
    tool: str
    status: str = Field(description="created, running, paused, retrying, succeeded, failed or cancelled")
    current_step: str | None
    steps_done: int
    steps_total: int
    completed_steps: list[str]
    progress: Progress | None = Field(description="Progress inside the current step, as the step reports it.")
    attempts: int
    max_attempts: int
    failure_class: str | None = Field(description="Error class of the last failure (transient ones are retried).")
    failure_reason: str | None
    pause_reason: str | None
    pause_requested: str | None = Field(
        description="A running task asked to pause (the reason): it pauses at its next step boundary.")
    input_request: dict[str, Any] | None = Field(
        description="What a paused task asks for: {key: {message, schema}}; answer with resume_task's input.")
    next_retry_at: datetime | None
    deadline_at: datetime | None = Field(
        description="Unfinished by then, it ends (failed, transient, with the reason); resume_task then runs it "
                    "again with as long again. Null once it ended.")
    created_at: datetime
    last_update: datetime
    finished_at: datetime | None
    cancellable: bool
    retryable: bool = Field(description="resume_task would run it again (from its last checkpoint).")
    forked_from: str | None = Field(description="The task this one re-runs (fork_task), from step forked_at_step.")
    forked_at_step: str | None
    next_action: str


def next_action(task: Task) -> str:
    match task.status:
        case TaskStatus.CREATED:
            return "Queued. Poll get_task_status (wait_seconds waits with progress), or cancel_task."
        case TaskStatus.RUNNING if task.pause_requested:
            return (f"Running step {task.current_step!r}; it pauses when this step is done, as asked "
                    f"({task.pause_requested}). resume_task withdraws the request; cancel_task stops it.")
        case TaskStatus.RUNNING:
            return (f"Running step {task.current_step!r} ({len(task.completed_steps)}/{task.steps_total} done). "
                    "Poll get_task_status or get_task_result with wait_seconds, or cancel_task.")
        case TaskStatus.RETRYING:
            return (f"Backing off after a transient error ({task.failure_reason}); attempt {task.attempts} of "
                    f"{task.max_attempts} is due at {task.next_retry_at:%Y-%m-%dT%H:%M:%SZ}. "
                    "resume_task retries now; cancel_task stops it.")
        case TaskStatus.PAUSED if task.waiting_until is not None:
            return (f"Waiting: {task.pause_reason}. It goes on by itself when that arrives, or when the wait gives "
                    "up; cancel_task stops it.")
        case TaskStatus.PAUSED if task.input_request:
            return (f"Paused: {task.pause_reason} Answer with resume_task(task_id, input={{...}}) giving "
                    f"{', '.join(sorted(task.input_request))}, or cancel_task.")
        case TaskStatus.PAUSED:
            return f"Paused: {task.pause_reason} resume_task continues it; cancel_task stops it."
        case TaskStatus.SUCCEEDED:
            return "Done. get_task_result returns the result."
        case TaskStatus.FAILED:
            return _next_action_failed(task)
        case _:
            return "Cancelled. Start a new task with a new idempotency_key if the work is still needed."


def _next_action_failed(task: Task) -> str:
    if state.resumable(task):
        return (f"Failed ({task.failure_class}): {task.failure_reason}. resume_task runs it again from its last "
                "checkpoint.")
    if task.failure_class == ErrorClass.INTERNAL_ERROR:
        return (f"Failed: {task.failure_reason}. resume_task runs it again once an operator marks the cause "
                "fixed.")
    return (f"Failed ({task.failure_class}): {task.failure_reason}. Another run would fail the same way: "
            "fix the input and start a new task with a new idempotency_key.")


def describe(task: Task) -> TaskStatusView:
    in_step = task.progress_done is not None or task.progress_message
    return TaskStatusView(
        task_id=str(task.pk), tool=task.tool, status=task.status, current_step=task.current_step or None,
        steps_done=len(task.completed_steps), steps_total=task.steps_total, completed_steps=task.completed_steps,
        progress=Progress(done=task.progress_done, total=task.progress_total, message=task.progress_message)
        if in_step else None,
        attempts=task.attempts, max_attempts=task.max_attempts, failure_class=task.failure_class or None,
        failure_reason=task.failure_reason or None, pause_reason=task.pause_reason or None,
        pause_requested=task.pause_requested or None,
        input_request=task.input_request if task.status == TaskStatus.PAUSED else None,
        next_retry_at=task.next_retry_at if task.status == TaskStatus.RETRYING else None,
        deadline_at=None if task.finished else task.deadline_at,
        created_at=task.created_at, last_update=task.updated_at, finished_at=task.finished_at,
        cancellable=task.status in state.ACTIVE, retryable=state.resumable(task),
        forked_from=str(task.forked_from_id) if task.forked_from_id else None,
        forked_at_step=task.forked_at_step or None, next_action=next_action(task))


def long_tools() -> list[str]:
    return sorted(spec.name for spec in all_tools() if spec.pipeline is not None)


# --- starting -----------------------------------------------------------------------------------


def inner_call(tool: str, arguments: dict[str, Any], key: str) -> tuple[ToolSpec, BaseModel]:
    """The long tool start_task names, and the arguments for it, validated by its own model."""
    try:
        spec = get_tool(tool)
    except NotFound:
        raise NotFound(f"tool: no tool {tool!r}; tools that run as tasks: {', '.join(long_tools())}") from None
    if spec.pipeline is None:
        raise InvalidInput(f"tool: {tool} does not run as a task; tools that do: {', '.join(long_tools())}")
    given = sorted(ENGINE_FIELDS & arguments.keys())
    if given:
        raise InvalidInput(f"arguments: give {', '.join(given)} to start_task itself, not inside arguments")
    return spec, validate_arguments(spec, {**arguments, "idempotency_key": key})


def inner_of(args: Any) -> tuple[ToolSpec, BaseModel]:
    """start_task's long tool and its validated arguments: validated once per call, the first time
    they are asked for (check_start, before the claim), and kept on `args` (its `_inner`) for the
    fingerprint and the handler."""
    if args._inner is None:
        args._inner = inner_call(args.tool, args.arguments, args.idempotency_key)
    found: tuple[ToolSpec, BaseModel] = args._inner
    return found


def check_start(args: Any) -> None:
    """start_task's checks before its key is claimed (so a typo leaves the key unused): the inner
    arguments against their tool's model, then the pipeline's own checks (allow-lists, sizes), and
    the webhook, against the allow-list send_notification's webhooks pass (checked again when sent)."""
    spec, validated = inner_of(args)
    if spec.pipeline.validate is not None:
        spec.pipeline.validate(validated)
    if getattr(args, "notify_url", None) is not None:
        url_allowlist.check(args.notify_url, conf().webhook_allowed_prefixes, field="notify_url")


def start_arguments(args: Any, version: int) -> dict[str, Any]:
    """What start_task's fingerprint covers: the tool, the webhook, and the long tool's arguments as
    that tool's own fingerprint covers them (values normalised, its non-business fields left out, no
    default it did not send), so a conflict names the inner field (`arguments.title`). Under
    version 1 (before versions) the inner arguments as they came."""
    own = get_tool(START_TASK).sent_arguments(args, version)
    if version == FINGERPRINT_FILLED:
        return own
    spec, validated = inner_of(args)
    return {**own, "arguments": spec.business_arguments(validated)}


def start(ctx: ToolContext, args: Any) -> Task:
    """Create the task start_task's `args` ask for (its handler, inside the engine's transaction;
    check_start has passed). `args.notify_url` is told when it finishes (state.finished); it must end
    by its tool's deadline, or the shorter one its caller asked for (`args._deadline`, set by `begin`)."""
    spec, validated = inner_of(args)
    pipeline = spec.pipeline
    # Over the agent's limit of unfinished tasks: refused (rate_limited), and this key may start it later.
    access.admit_task(ctx.tenant_id, ctx.actor, lambda: Task.objects.filter(
        tenant_id=ctx.tenant_id, actor=ctx.actor, status__in=state.ACTIVE).count())
    business = validated.model_dump(mode="json", exclude=set(spec.excluded_from_fingerprint))
    # A document URL's query (a signed URL's token) is needed by the worker that fetches it and by
    # no one else: it is stored only sealed, and the task shows the URL without it.
    shown, secret = redaction.split_secrets(business)
    return state.create_task(
        record=ctx.record, tool=spec.name, arguments=shown, sealed_arguments=redaction.seal(secret),
        input_digest=keys.digest(business), steps_total=len(pipeline.steps),
        max_attempts=pipeline.retry.attempts_allowed(), actor=ctx.actor, trace_id=ctx.trace_id, span_id=ctx.span_id,
        notify_url=args.notify_url or "", deadline=args._deadline)


def handle(task: Task) -> TaskHandle:
    """What start_task answers: the task's id, at once."""
    return TaskHandle(task_id=str(task.pk), tool=task.tool, created_at=task.created_at,
                      next_action="Poll get_task_status with this task_id; get_task_result once it succeeded. "
                                  "Retrying start_task with the same idempotency_key returns this same task.")


@dataclass
class Started:
    """A long tool's start: the call's result, and its task (None when refused before one existed)."""

    result: CallResult
    task: Task | None


def begin(spec: ToolSpec, caller: Caller, arguments: dict[str, Any], meta_key: str | None,
          deadline: timedelta | None = None) -> Started | polling.Pending[Started]:
    """A long tool's own call, made into the start_task operation for it in one pass: its arguments
    validated once (inner_of), run by the engine as start_task's operation (one key space, one task),
    the task handed back as a value. `deadline`: the caller asks its task to end sooner than its
    tool's deadline (a longer one is capped to the tool's); it is no argument of the operation."""
    arguments = dict(with_idempotency_key(arguments, meta_key))
    start_spec = get_tool(START_TASK)
    given = {"tool": spec.name, "idempotency_key": arguments.pop("idempotency_key")}
    if arguments.get("trace_id") is not None:
        given["trace_id"] = arguments.pop("trace_id")
    args: Any = checked_arguments(start_spec, {**given, "arguments": arguments})
    args._deadline = deadline
    created: list[Task] = []

    def create(ctx: ToolContext, args: Any) -> TaskHandle:
        created.append(start(ctx, args))
        return handle(created[0])

    def started(result: CallResult) -> Started:
        if result.error is not None or result.record is None:
            return Started(CallResult(spec, error=result.error, record=result.record, replayed=result.replayed), None)
        # Made by this call, or (a replay) the one task of the key's record.
        task = created[0] if created else Task.objects.select_related("record").get(record=result.record)
        return Started(result, task)

    return polling.after(run_write(start_spec, caller, args, handler=create), started)


def start_through_engine(spec: ToolSpec, caller: Caller, arguments: dict[str, Any], meta_key: str | None,
                         deadline: timedelta | None = None) -> tuple[CallResult, Task | None]:
    """`begin`, waiting in this thread if it must (the MCP tasks extension's start, the tests)."""
    begun = polling.settle(begin(spec, caller, arguments, meta_key, deadline))
    return begun.result, begun.task


def call_task_tool(spec: ToolSpec, caller: Caller, arguments: dict[str, Any], meta_key: str | None
                   ) -> CallResult | polling.Pending[CallResult]:
    """A direct call of a long tool: start_task for it, then wait a bounded time for the result."""

    def waited(started: Started) -> CallResult | polling.Pending[CallResult]:
        if started.task is None:
            return started.result
        return polling.after(wait_for(started.task, conf().task_call_wait_seconds, caller.report_progress),
                             lambda task: outcome(spec, task, replayed=started.result.replayed))

    return polling.after(begin(spec, caller, arguments, meta_key), waited)


def outcome(spec: ToolSpec, task: Task, *, replayed: bool = False) -> CallResult:
    """The call result a task stands for: its result once succeeded, else the error saying why not."""
    if task.status == TaskStatus.SUCCEEDED:
        return CallResult(spec, result=task.result, record=task.record, replayed=replayed)
    return CallResult(spec, error=unfinished(task), record=task.record, replayed=replayed)


def unfinished(task: Task) -> ToolFailure:
    """The error that stands for a task without a result (yet)."""
    details = {"task_id": str(task.pk), "task_status": task.status}
    if task.status == TaskStatus.FAILED:
        failure = ToolFailure.from_dict({"class": task.failure_class or ErrorClass.TRANSIENT, "message": (
            f"task {task.pk} failed: {task.failure_reason}. {next_action(task)}")})
        return failure.replaced(
            details={**details, "reference": str(task.pk)} if isinstance(failure, InternalError) else details)
    if task.status == TaskStatus.CANCELLED:
        return AlreadyDone(f"task {task.pk} was cancelled ({task.failure_reason})", details=details)
    return InProgress(f"{task.tool} runs as task {task.pk}, now {task.status}. {next_action(task)} "
                      "Calling again with the same idempotency_key waits for the same task.",
                      retry_after=conf().task_poll_interval_ms / 1000, details=details)


# --- waiting ------------------------------------------------------------------------------------


def wait_for(task: Task, seconds: float,
             report_progress: Callable[[float, float | None, str | None], None] | None = None
             ) -> Task | polling.Pending[Task]:
    """The task once it finishes or pauses, or `seconds` pass (a handle on the wait: polling.waiting),
    reporting progress as it moves.

    Progress is steps done plus the fraction of the current step, out of the
    number of steps; it never goes backwards (a step re-run after a crash
    does not un-report what the caller saw).
    """
    reported = [-1.0]

    def settled() -> bool:
        if report_progress is not None and (done := overall_progress(task)) > reported[0]:
            reported[0] = done
            report_progress(done, float(task.steps_total), progress_message(task))
        return task.finished or task.status == TaskStatus.PAUSED

    return polling.waiting(settled, lambda: task, seconds=min(seconds, conf().task_max_wait_seconds), pause=0.05,
                           max_pause=0.5, refresh=lambda: reread(task),
                           watch=polling.Watch(db.table(Task), task.pk, WAITED_ON))


# What a task's waiter looks at: any transition (the version), and the progress a step reports.
WAITED_ON = ("version || ':' || coalesce(progress_done::text, '') || ':' || coalesce(progress_total::text, '') "
             "|| ':' || progress_message")


def reread(task: Task) -> Task:
    """What waiting needs of the task, not its arguments (an inline document can be megabytes),
    with the database's time of the read."""
    task.__dict__.update(Task.objects.filter(pk=task.pk).values(*WATCHED_FIELDS, read_at=clock.NOW).get())
    return task


WATCHED_FIELDS = ["status", "current_step", "completed_steps", "progress_done", "progress_total",
                  "progress_message", "attempts", "failure_class", "failure_reason", "pause_reason", "pause_requested",
                  "input_request", "next_retry_at", "lease_expires_at", "result", "version", "updated_at",
                  "finished_at", "deadline_at", "time_allowed", "waiting_until"]


def overall_progress(task: Task) -> float:
    done = float(len(task.completed_steps))
    if task.status == TaskStatus.RUNNING and task.progress_done is not None and task.progress_total:
        done += max(0.0, min(1.0, task.progress_done / task.progress_total))
    return done


def progress_message(task: Task) -> str:
    if task.status == TaskStatus.RUNNING and task.current_step:
        detail = f": {task.progress_message}" if task.progress_message else ""
        return f"{task.current_step}{detail}"
    return task.status
