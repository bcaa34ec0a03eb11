"""Step pipelines: how a long tool declares the work its task does, once.

A pipeline is an ordered list of named steps. Each step is a function of a
StepContext (the tool's arguments, the outputs of the steps before it, a way
to report progress) returning a JSON-serializable output, which is
checkpointed. The output of the last step is the tool's result.

The pipeline also says what to do when a step raises:
- a ToolFailure carries its own class: `transient` is retried, any other class
  is final (the task fails, and resume_task refuses with the reason);
- exceptions listed in `transient` (by default core.errors.INFRASTRUCTURE_ERRORS: the database
  or the network failed) are retried with exponential backoff and equal jitter (core.backoff),
  up to `max_attempts` runs of the task;
- exceptions listed in `final` fail the task as `invalid_input`;
- anything else is a bug: logged, and the task fails at once as `internal_error` (another run
  would fail the same way). resume_task runs it again only once an operator marks the cause
  fixed; a pipeline that knows an exception type passes lists it in `transient`.
A step that must wait for a person or a dependency raises WaitFor: the task
is paused until resume_task (or the tasks extension's tasks/update) supplies
the answer.

A step that waits for an event (a downstream's callback, a message with a
correlation key) or for a time calls `ctx.wait_for_event(event, key, timeout=...)`
or `ctx.sleep_until(when)`: a durable wait (tools_app.tasks.waits). The task is
parked in the database, holding no worker, until the event arrives (`send_event`)
or the time comes; then the step runs again from its start and the same call
answers the event's payload (None once the timeout passed). An event sent before
the wait began is kept, and answers it at once.

Versions: a pipeline carries a `version`; a task keeps the version it started
with (Task.pipeline_version). A deploy that changes the steps bumps it and
either keeps the old pipeline runnable (`previous`), or declares its steps run
the old version too (`also_runs`, its steps branching on `ctx.patched(n)`), or
else refuses to start while tasks of a version it cannot run are unfinished
(tools_app.tasks.versions). A saga's compensation plan is its version's.

A step that changes many things in one go (a batch of tickets, a document's
embeddings) calls `ctx.each_batch(items, size, apply)`: each batch's effect
and its record commit together, so a resumed step skips the batches done.

A saga: steps may declare a `compensate` function. When a step fails for
good, the steps before it that declared one are undone in reverse order, each
compensation a checkpointed step of its own (idempotent: it may run again
after a crash), and then the task fails with the original error
(`Pipeline.plan`).

A long tool is declared with `task_tool(...)`: it is a write tool whose call
starts (or rejoins) its task; see tools_app.tasks.agent_view. It also declares
its `deadline` (IDEMOPS_TASK_DEADLINE_SECONDS when it does not): a task not done
by then ends, failed with the reason, so a task nobody finishes (a pause nobody
answers) never holds its key forever. A caller may ask for less
(`Pipeline.time_allowed`), never for more.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any, Generic, TypeVar

from django.db import DataError
from pydantic import BaseModel

from tools_app.access.models import Tenant
from tools_app.conf import conf
from tools_app.core import backoff
from tools_app.core.errors import (
    INFRASTRUCTURE_ERRORS,
    InvalidInput,
    ToolFailure,
    Transient,
    internal_error,
    invalid_data,
)
from tools_app.engine import ExpiryPolicy
from tools_app.toolkit.policies import ApprovalPolicy, KeepFor
from tools_app.toolkit.registry import (
    Retention,
    ToolContext,
    ToolSpec,
    WriteInputT,
    grouped_retention,
    register,
)


class Interrupted(Exception):
    """The task was cancelled or its lease was lost: stop now, write nothing."""


class Parked(Exception):  # a signal, not an error
    """A durable wait began (StepContext.wait_for_event, sleep_until): the runner parks the task."""

    def __init__(self, wait: Any) -> None:
        super().__init__(str(wait))
        self.wait = wait  # a tools_app.tasks TaskWait (a layer above the toolkit)


class WaitFor(Exception):  # a signal, not an error
    """Pause the task until someone answers `input_request` (or just resumes it).

    `input_request` maps a key to {"message": ..., "schema": JSON Schema of the
    answer}; the answer arrives as StepContext.resume_input[key].
    """

    def __init__(self, reason: str, input_request: dict[str, Any] | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.input_request = input_request


# The tool's input model: a step declared `fn(ctx: StepContext[MyInput])` sees `ctx.arguments` as a MyInput.
ArgumentsT = TypeVar("ArgumentsT", bound=BaseModel)


class StepContext(Generic[ArgumentsT]):
    """What a running step sees. Built by the runner (tools_app.tasks.runner)."""

    # `task`: a tools_app.tasks Task (a layer above the toolkit, so not named here).
    def __init__(self, *, task: Any, arguments: ArgumentsT, outputs: Mapping[str, Any],
                 progress: Callable[[float, float | None, str], None],
                 batches: Callable[..., list[Any]] | None = None, waits: Any = None) -> None:
        self.task = task
        self.task_id = task.pk
        self.tenant_id = task.tenant_id
        self.arguments = arguments
        self.outputs = outputs
        self.resume_input: dict[str, Any] = task.resume_input or {}
        self._progress = progress
        self._batches = batches
        self._waits = waits
        # The version of the pipeline the task started with (Pipeline.version).
        self.pipeline_version: int = getattr(task, "pipeline_version", 1) or 1

    def patched(self, since: int) -> bool:
        """A patch marker: whether this task started on pipeline version `since` or later. A step changed by
        a deploy keeps its old code under `if not ctx.patched(n):` for the tasks that started before it."""
        return self.pipeline_version >= since

    def wait_for_event(self, event: str, key: str, *, timeout: timedelta, description: str = "") -> Any:
        """Wait, durably, for `event` with correlation `key` (sent by idemops.tools.send_event or
        POST /api/v1/task-events): its payload, or None once `timeout` (from the first time this step
        reached this wait) passed. Until then the task is parked, holding no worker; the step runs again
        from its start when the event arrives or the time comes, so what comes before a wait must be
        safe to run again (or be a step of its own). `description` names what is awaited in the task's
        status ("the gateway's callback")."""
        if self._waits is None:
            raise RuntimeError("wait_for_event needs the task runner's wait store")
        return self._waits.wait_for_event(event, key, timeout=timeout, description=description)

    def sleep_until(self, when: Any, description: str = "") -> None:
        """Wait, durably, until `when` (an aware datetime, or a timedelta from the first time this step got
        here): the task is parked meanwhile, holding no worker."""
        if self._waits is None:
            raise RuntimeError("sleep_until needs the task runner's wait store")
        self._waits.sleep_until(when, description=description)

    def progress(self, done: float, total: float | None = None, message: str = "") -> None:
        """Record progress inside the step; raises Interrupted once the task is cancelled
        (long steps call it often: it is also the cooperative cancellation point)."""
        self._progress(done, total, message)

    def each_batch(self, items: list[Any], size: int, apply: Callable[[list[Any]], Any]) -> list[Any]:
        """Run `apply` on `items` in batches of `size`; the outputs of every batch, in order.

        Each batch runs in a transaction that also records its output and
        checks this worker still holds the task's lease, so a batch's effect
        and its record commit together or not at all. A step that runs again
        (after a crash) reuses the recorded outputs of the batches done and
        applies only the rest: each item is changed once. `apply` must only
        write to this database (it runs inside the transaction).
        """
        if self._batches is None:
            raise RuntimeError("each_batch needs the task runner's batch store")
        return self._batches(items, size, apply, self.progress)


StepFunction = Callable[[StepContext[Any]], Any]


@dataclass(frozen=True)
class Step:
    name: str
    run: StepFunction
    version: int = 1  # bump when the step's output changes: its old checkpoints stop being valid
    # Undoes this step's effect once a later step failed for good (a saga). Reads the step's own
    # output in ctx.outputs[name]; must be idempotent: after a crash it runs again.
    compensate: StepFunction | None = None


# Names of the steps a saga adds once a step failed for good (Pipeline.plan).
FAILED_PREFIX = "failed:"
COMPENSATE_PREFIX = "compensate:"


def _failure_marker(ctx: StepContext[Any]) -> Any:
    raise AssertionError("a failure marker is written by the runner, never run")


@dataclass(frozen=True)
class RetryPolicy:
    """How often a task runs and how long it waits between runs (core.backoff); None means the IDEMOPS setting."""

    max_attempts: int | None = None
    base_seconds: float | None = None
    max_seconds: float | None = None

    def attempts_allowed(self) -> int:
        return self.max_attempts or conf().task_max_attempts

    def backoff(self, attempt: int, rng: random.Random | None = None) -> float:
        """Seconds to wait after the `attempt`-th run failed: core.backoff.delay, uniform in [cap/2, cap]."""
        base = self.base_seconds if self.base_seconds is not None else conf().task_backoff_base_seconds
        ceiling = self.max_seconds if self.max_seconds is not None else conf().task_backoff_max_seconds
        return backoff.delay(attempt, base=base, ceiling=ceiling, rng=rng)


@dataclass(frozen=True)
class Pipeline:
    steps: tuple[Step, ...]
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    # What a step may raise that another run may get past; anything else not a ToolFailure is a
    # programming error (internal_error): the task fails at once instead of retrying it.
    transient: tuple[type[BaseException], ...] = INFRASTRUCTURE_ERRORS
    final: tuple[type[BaseException], ...] = ()
    # Checks beyond the input model that must hold before a task is created
    # (allow-lists, decodability): a bad call fails at once, not as a task. Given the validated
    # arguments (an instance of the tool's input model, as ToolSpec.check is).
    validate: Callable[[Any], None] | None = None
    # How long a task may take from its start to its end, pauses and backoffs included (task_tool's
    # `deadline`); None: IDEMOPS_TASK_DEADLINE_SECONDS.
    deadline: timedelta | None = None
    # The pipeline's version: bump it when a deploy changes the steps. A task keeps the version it
    # started with (Task.pipeline_version) and runs only on code that can run that version.
    version: int = 1
    # Older versions these steps also run, through patch markers (`ctx.patched(n)` in the steps).
    also_runs: tuple[int, ...] = ()
    # Older pipelines kept runnable, whole, for the tasks that started on them (each with its version).
    previous: tuple[Pipeline, ...] = ()

    def __post_init__(self) -> None:
        names = [step.name for step in self.steps]
        if not names or len(set(names)) != len(names):
            raise ValueError(f"a pipeline needs steps with unique names, got {names}")
        if self.deadline is not None and self.deadline <= timedelta(0):
            raise ValueError(f"a pipeline's deadline must be positive, got {self.deadline}")
        if self.version < 1:
            raise ValueError(f"a pipeline's version is a positive integer, got {self.version}")
        versions = [self.version, *self.also_runs, *(p.version for p in self.previous)]
        if len(set(versions)) != len(versions):
            raise ValueError(f"a pipeline version is declared twice: {versions}")
        if any(v >= self.version for v in versions[1:]):
            raise ValueError(f"older versions must be lower than the pipeline's {self.version}: {versions[1:]}")

    def for_version(self, version: int | None) -> Pipeline | None:
        """The pipeline that runs a task started on `version` (None: the current one): this one, or an older
        one kept in `previous`; None when this code cannot run it."""
        if version is None or version == self.version or version in self.also_runs:
            return self
        return next((older for older in self.previous if older.for_version(version) is older), None)

    def versions(self) -> tuple[int, ...]:
        """Every version this code runs."""
        return (self.version, *self.also_runs, *(v for p in self.previous for v in p.versions()))

    def time_allowed(self, requested: timedelta | None = None) -> timedelta:
        """The time a task of this pipeline gets (`time_allowed`)."""
        return time_allowed(self.deadline, requested)

    def index_of(self, name: str) -> int:
        return [step.name for step in self.steps].index(name)

    def compensates_before(self, index: int) -> bool:
        """Whether a failure of step `index` has anything to undo."""
        return any(step.compensate is not None for step in self.steps[:index])

    def plan(self, failed_at: int | None = None) -> tuple[Step, ...]:
        """The steps a task runs: the pipeline's; or, once step `failed_at` failed for good, the steps
        before it, a marker holding the failure (checkpointed like any output, so a resumed task knows
        it is compensating), and the compensations of the steps before it in reverse order."""
        if failed_at is None:
            return self.steps
        failed = self.steps[failed_at]
        undo = tuple(Step(f"{COMPENSATE_PREFIX}{step.name}", step.compensate, step.version)
                     for step in reversed(self.steps[:failed_at]) if step.compensate is not None)
        return (*self.steps[:failed_at], Step(f"{FAILED_PREFIX}{failed.name}", _failure_marker, failed.version),
                *undo)

    def classify(self, exc: BaseException, reference: object = "") -> ToolFailure:
        """The failure a step's exception stands for; `.retryable` says whether to retry. `reference`
        (the task's id) is what an internal_error tells the agent to report."""
        if isinstance(exc, ToolFailure):
            return exc
        if isinstance(exc, DataError):  # a DatabaseError, but the same values fail the same way
            return invalid_data(exc)
        if isinstance(exc, self.final):
            return InvalidInput(str(exc) or type(exc).__name__)
        if isinstance(exc, self.transient):
            return Transient(f"{type(exc).__name__}: {exc}"[:500])
        return internal_error(exc, reference, what="the task stopped at its last checkpoint")


def time_allowed(deadline: timedelta | None, requested: timedelta | None = None) -> timedelta:
    """The time a task gets: its tool's `deadline` (None: IDEMOPS_TASK_DEADLINE_SECONDS), or the shorter
    one a caller asked for; a longer one is capped, as the tool's deadline is what its author promises."""
    declared = deadline if deadline is not None else timedelta(seconds=conf().task_deadline_seconds)
    return min(declared, requested) if requested is not None and requested > timedelta(0) else declared


def _runs_as_task(ctx: ToolContext, args: Any) -> dict[str, Any]:
    # calls.call_tool sends long tools to tools_app.tasks.agent_view before any handler runs.
    raise AssertionError("a long tool's call starts its task; it has no direct handler")


def task_tool(*, name: str, title: str, description: str, input_model: type[WriteInputT],
              output_model: type[BaseModel], pipeline: Pipeline, personal_fields: frozenset[str],
              non_business_fields: frozenset[str] = frozenset(),
              retention: Retention | timedelta | Callable[[], timedelta] | None = None,
              destructive: bool = False, open_world: bool = False,
              approval: Callable[[Tenant, WriteInputT], ApprovalPolicy | None] | None = None,
              operation_arguments: Callable[[WriteInputT, int], dict[str, Any]] | None = None,
              counted_defaults: tuple[dict[str, Any], ...] = (), deadline: timedelta | None = None,
              downstream: str | None = None,
              # Deprecated (API_VERSION 2.1): grouped in retention=Retention(key=, on_expiry=, keep=).
              on_expiry: ExpiryPolicy | None = None, keep: KeepFor | None = None) -> ToolSpec:
    """Declare a long tool: calling it starts (or rejoins) a task running `pipeline`, checkpointed step by
    step; its answer is the task's handle until the task ends, then its result. `retention` as write_tool's;
    `approval` and `operation_arguments` read `input_model` (mypy holds them to it, as the pipeline's steps
    read it as `StepContext[input_model]`). `deadline`: how long its task may take, from its start to its end
    (None: the pipeline's own, else IDEMOPS_TASK_DEADLINE_SECONDS)."""
    kept = grouped_retention(name, retention, on_expiry, keep, stacklevel=4)
    if deadline is not None:
        pipeline = replace(pipeline, deadline=deadline)
    return register(ToolSpec(
        name=name, title=title, description=description, input_model=input_model, output_model=output_model,
        handler=_runs_as_task, writes=True, pipeline=pipeline, personal_fields=personal_fields,
        non_business_fields=non_business_fields, retention=kept.key, on_expiry=kept.on_expiry, keep=kept.keep,
        destructive=destructive, open_world=open_world, approval=approval,
        operation_arguments=operation_arguments, counted_defaults=counted_defaults, downstream=downstream))
