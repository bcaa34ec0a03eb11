"""The worker side of long tasks: running a task's pipeline (the `run_task` job, tasks/jobs.py).

The job takes the task's lease (state.take) or
ends at once: the lease, not django-q2, decides who runs a task. It resumes
after the last valid checkpoint, runs each remaining step under a heartbeat
that renews the lease and notices a cancel, and writes each step's
checkpoint in the transaction that advances the task. Every write is
guarded by the lease, so a worker that lost it (cancelled, or presumed dead
and replaced) writes nothing more.

A pause asked for from outside (control.pause) is honoured at a step
boundary: before the run's first step and after each checkpoint, the runner
reads the request and, if there is one, pauses the task there instead of
starting the next step. A step is never cut short by a pause. The same read
says whether the task's deadline has passed: then the task ends there
(state.end_at_deadline) rather than start another step; the sweep ends one
whose step is still running (its heartbeat then loses the lease), and a
last step that finishes late still succeeds: its work is done.

Each step run is a span in the trace of the call that started the task (whichever worker runs
it, however often the task was resumed), one log line (`task.step`: outcome, duration, attempt)
and an observation of `idemops_task_step_seconds{tool,step}`.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from tools_app.conf import conf
from tools_app.core import counters, leases, logs, redaction, tracing
from tools_app.core.crashpoints import crash_point
from tools_app.core.errors import Held, ToolFailure, Transient
from tools_app.tasks import checkpoints, state, waits
from tools_app.tasks.batches import BatchStore
from tools_app.tasks.models import StepOutcome, StepRun, Task
from tools_app.toolkit.calls import observed
from tools_app.toolkit.pipelines import (
    COMPENSATE_PREFIX,
    FAILED_PREFIX,
    Interrupted,
    Parked,
    Pipeline,
    Step,
    StepContext,
    WaitFor,
)
from tools_app.toolkit.registry import ToolSpec, get_tool, parse_arguments

logger = logging.getLogger(__name__)
# When a held step (core.errors.Held) is tried again if its answer named no time.
HELD_RETRY_SECONDS = 10.0
# When a task of a pipeline version this code cannot run is offered again (to a worker of another deploy).
UNRUNNABLE_RETRY_SECONDS = 60.0
# What a run of the job ends with: its outcome, and the seconds until the retry if this job should wait.
Outcome = tuple[str, float | None]


class Heartbeat(leases.Heartbeat):
    """The task's lease heartbeat (tools_app.core.leases): also carries the step's progress,
    and lets the step notice a cancel (a cancel clears the lease, so renewal fails)."""

    def __init__(self, task_id: uuid.UUID, owner: str):
        self._progress: tuple[float | None, float | None, str] | None = None
        self._announced: tuple[float | None, float | None, str] | None = None
        super().__init__(lambda: state.renew_lease(task_id, owner, self._progress, self._announce()),
                         leases.heartbeat_interval(conf().task_heartbeat_seconds, state.lease_seconds()),
                         name=f"heartbeat-{task_id}")

    def _announce(self) -> bool:
        """Whether the progress moved since the last renewal told the watchers."""
        progress = self._progress
        moved, self._announced = progress != self._announced, progress
        return moved

    def progress(self, done: float, total: float | None = None, message: str = "") -> None:
        self.check()
        self._progress = (done, total, message)

    def check(self) -> None:
        if self.lost.is_set():
            raise Interrupted("the task was cancelled or its lease was lost")


@dataclass
class _Walk:
    """Where a run of the task's plan stands: the step it is at (and that step's StepRun, once begun), the
    outputs and checksums of the steps before it, and, once a saga compensates, the compensation plan and
    the step that failed for good."""

    plan: tuple[Step, ...]
    failed_at: int | None
    index: int
    outputs: dict[str, Any]
    checksums: list[str]
    run: StepRun | None = None


class Runner:
    def __init__(self, task: Task, owner: str):
        self.task = task
        self.owner = owner
        self.spec: ToolSpec = get_tool(task.tool)
        # The pipeline of the version the task started with (Pipeline.for_version): its steps, and its
        # saga's compensations; None when this deploy cannot run that version (tasks.versions).
        self.runnable: Pipeline | None = self.spec.pipeline.for_version(task.pipeline_version)
        self.pipeline: Pipeline = self.runnable or self.spec.pipeline
        self.slice_ends = time.monotonic() + conf().task_slice_seconds

    def run(self) -> tuple[str, float | None]:
        """Run the remaining steps. Returns (outcome, seconds until the retry if this job should wait)."""
        task = self.task
        with observed(self.spec, task.tenant_id, task.arguments, key=task.record.key, task_id=str(task.pk)):
            return self._run()

    def _run(self) -> Outcome:
        task = self.task
        if self.runnable is None:
            return self._unrunnable()
        try:
            arguments = parse_arguments(self.spec.input_model, {
                **task.arguments, **redaction.unseal(task.sealed_arguments), "idempotency_key": task.record.key})
            resumption = checkpoints.valid_prefix(task, self.pipeline, actor=self.owner)
        except Exception as exc:
            return self._failed(None, exc)
        walk = _Walk(plan=resumption.plan, failed_at=resumption.failed_at, index=resumption.next_index,
                     outputs=dict(resumption.outputs), checksums=list(resumption.checksums))
        while walk.index < len(walk.plan):
            step = walk.plan[walk.index]
            if walk.run is None:
                walk.run = state.begin_step(task, self.owner, step, walk.index, completed=list(resumption.outputs))
                if walk.run is None:  # the boundary stopped it (a pause asked for, the deadline), or it is not ours
                    boundary = state.at_boundary(task.pk)
                    if boundary.past_deadline:
                        return self._past_deadline()
                    if boundary.pause:
                        return self._pause(boundary.pause, step)
                    return "interrupted before step " + step.name, None
            ended = self._step(walk, step, walk.run, arguments)
            if ended is not None:
                return ended
        if walk.failed_at is not None:
            return self._compensated(walk.plan, walk.failed_at, walk.outputs)
        return self._succeed(walk.outputs[walk.plan[-1].name])

    def _step(self, walk: _Walk, step: Step, run: StepRun, arguments: Any) -> Outcome | None:
        """Run the walk's current step (under `run`) and checkpoint it. Returns the job's outcome if the job
        ends here, None if it goes on with the walk's next step (the walk then says which, under which run)."""
        task, index = self.task, walk.index
        with self._observed(step, index) as seen:
            heartbeat = Heartbeat(task.pk, self.owner)
            batches = BatchStore(task, self.owner, index, checkpoints.input_digest(task, step, walk.checksums))
            context = StepContext(task=task, arguments=arguments, outputs=walk.outputs, progress=heartbeat.progress,
                                  batches=batches, waits=waits.WaitStore(task, index))
            try:
                with heartbeat:
                    output = step.run(context)
                prepared = checkpoints.prepare(task, step, index, output, walk.checksums)
            except Interrupted:
                state.finish_step_run(run, StepOutcome.INTERRUPTED)
                return f"interrupted in step {step.name}", None
            except Parked as parked:
                if waits.park(task, self.owner, parked.wait, run):
                    seen["outcome"] = "waiting"
                    return f"waiting in step {step.name}: {task.pause_reason}", None
                state.finish_step_run(run, StepOutcome.INTERRUPTED)
                return f"interrupted in step {step.name}", None
            except WaitFor as wait:
                if state.pause_for_input(task, self.owner, wait.reason, wait.input_request, run):
                    seen["outcome"] = "paused"
                    return f"paused in step {step.name}", None
                state.finish_step_run(run, StepOutcome.INTERRUPTED)
                return f"interrupted in step {step.name}", None
            except Exception as exc:
                return self._step_failed(walk, step, run, exc, seen)
            following = index + 1 < len(walk.plan)
            # This job goes on to the next step unless it has run long enough (then a fresh job does),
            # someone asked the task to pause, or its deadline passed (complete_step checks those two).
            then = (walk.plan[index + 1], index + 1) if following and not self._slice_used() else None
            advanced = state.complete_step(task, self.owner, prepared, run, then)
            if not advanced.moved:
                state.finish_step_run(run, StepOutcome.INTERRUPTED)
                return f"interrupted after step {step.name}", None
            seen["outcome"] = "succeeded"
        crash_point("after_checkpoint")
        # What later steps read is what a resumed run would read: the stored JSON.
        walk.outputs[step.name] = json.loads(prepared.data)
        walk.checksums.append(prepared.checksum)
        if following and advanced.next_run is None:
            return self._stop_at_boundary(advanced.boundary or state.at_boundary(task.pk), walk.plan[index + 1])
        walk.run = advanced.next_run
        walk.index += 1
        return None

    def _stop_at_boundary(self, boundary: state.Boundary, next_step: Step) -> Outcome:
        """This job stops after a checkpoint, before `next_step`: the deadline passed, a pause was asked for,
        or the job ran its slice (then a new job goes on)."""
        if boundary.past_deadline:
            return self._past_deadline()
        if boundary.pause:
            return self._pause(boundary.pause, next_step)
        return ("handed on to a new job" if state.hand_on(self.task, self.owner) else "interrupted"), None

    def _step_failed(self, walk: _Walk, step: Step, run: StepRun, exc: Exception, seen: dict[str, str]
                     ) -> Outcome | None:
        """The walk's current step raised: the task retries, fails, or (a saga's step failed for good)
        compensates, which goes on with the walk's next step (then None)."""
        failure = self._final_failure(exc)
        if walk.failed_at is not None or failure is None or not self.pipeline.compensates_before(walk.index):
            outcome, retry_at = self._failed(run, exc, compensating=walk.failed_at is not None)
            seen["outcome"] = outcome.split(" ")[0]  # retrying, failed or interrupted
            return outcome, retry_at
        return self._compensate(walk, step, run, failure, seen)

    def _compensate(self, walk: _Walk, step: Step, run: StepRun, failure: ToolFailure, seen: dict[str, str]
                    ) -> Outcome | None:
        """A saga's step failed for good: undo the steps before it, each a checkpointed step. The walk's
        plan becomes the compensation plan (its failure marker checkpointed at the failed step's index), and
        the walk goes on with the first compensation (None), unless the task was taken meanwhile."""
        task, index = self.task, walk.index
        walk.plan, walk.failed_at = self.pipeline.plan(index), index
        marker = checkpoints.prepare(task, walk.plan[index], index, failure.as_dict(), walk.checksums)
        compensating = state.begin_compensation(task, self.owner, marker, run, failure,
                                                (walk.plan[index + 1], index + 1), steps_total=len(walk.plan))
        if not compensating.moved:
            return f"interrupted after step {step.name} failed", None
        walk.run = compensating.next_run
        seen["outcome"] = "compensating"
        walk.outputs[marker.step.name] = json.loads(marker.data)
        walk.checksums.append(marker.checksum)
        walk.index += 1
        return None

    @contextmanager
    def _observed(self, step: Step, index: int) -> Iterator[dict[str, str]]:
        """One step run: its span (in the starting call's trace), its log line and its duration."""
        task = self.task
        seen = {"outcome": "interrupted"}
        started = time.perf_counter()
        with tracing.continued(task.trace_id, task.span_id, f"task.step {step.name}", **{
                "idemops.tool": task.tool, "idemops.task_id": str(task.pk), "idemops.step": step.name,
                "idemops.attempt": task.attempts}) as span, logs.bound(step=step.name):
            try:
                yield seen
            finally:
                seconds = time.perf_counter() - started
                span.set_attribute("idemops.outcome", seen["outcome"])
                counters.observe(counters.TASK_STEP, seconds, tool=task.tool, tenant_id=task.tenant_id, label=step.name)
                logs.get(__name__).info("task.step", outcome=seen["outcome"], sequence=index, attempt=task.attempts,
                                        duration_ms=round(seconds * 1000, 3))

    def _unrunnable(self) -> Outcome:
        """The task started on a pipeline version this deploy does not run: nothing of it runs here. It waits,
        visibly, for a worker that runs it (a deploy that kept the version); start-up names such tasks."""
        task = self.task
        held = Held(f"this deploy cannot run version {task.pipeline_version} of {task.tool}'s pipeline, which the "
                    f"task started on (it runs versions {', '.join(map(str, self.spec.pipeline.versions()))}): "
                    "deploy code that keeps that version, or cancel the task")
        logger.error("task %s: %s", task.pk, held.message)
        if state.retry_later(task, self.owner, held, UNRUNNABLE_RETRY_SECONDS, waited_by_worker=False,
                             counted=False):
            return f"held: {held.message}", None
        return "interrupted", None

    def _pause(self, reason: str, next_step: Step) -> tuple[str, float | None]:
        if state.pause_at_boundary(self.task, self.owner, reason, next_step):
            return f"paused before step {next_step.name}, as asked", None
        return "interrupted", None

    def _past_deadline(self) -> tuple[str, float | None]:
        ended = state.end_at_deadline(self.task, self.owner)
        return ("failed: its deadline passed" if ended else "interrupted"), None

    def _slice_used(self) -> bool:
        return time.monotonic() > self.slice_ends

    def _succeed(self, final_output: Any) -> tuple[str, float | None]:
        try:
            result = self.spec.output_model.model_validate(final_output).model_dump(mode="json")
        except ValidationError as exc:
            return self._failed(None, exc)
        return ("succeeded" if state.succeed(self.task, self.owner, result) else "interrupted"), None

    def _final_failure(self, exc: Exception) -> ToolFailure | None:
        """The failure `exc` stands for if it ends the task's forward run (no retry left), else None."""
        failure = self.pipeline.classify(exc, self.task.pk)
        if failure.retryable and self.task.attempts < self.task.max_attempts:
            return None
        if failure.retryable:
            return Transient(f"{failure.message} (gave up after {self.task.attempts} attempts)")
        return failure

    def _compensated(self, plan: tuple[Step, ...], failed_at: int, outputs: dict[str, Any]) -> tuple[str, float | None]:
        """Every compensation ran: the task fails with the error that started them."""
        marker = plan[failed_at]
        failure = ToolFailure.from_dict(outputs[marker.name])
        undone = [step.name.removeprefix(COMPENSATE_PREFIX) for step in plan[failed_at + 1:]]
        failure = failure.replaced(message=f"step {marker.name.removeprefix(FAILED_PREFIX)} failed: "
                                           f"{failure.message}; undone, in this order: {', '.join(undone)}")
        return ("failed" if state.fail(self.task, self.owner, failure) else "interrupted"), None

    def _classified(self, exc: Exception, *, compensating: bool) -> ToolFailure:
        """The failure a step's exception stands for (logged with its traceback unless it is a ToolFailure)."""
        task = self.task
        failure = self.pipeline.classify(exc, task.pk)
        if compensating and not failure.retryable:
            # An undo that cannot be done: a person must finish it (the task's checkpoints say how far it got).
            failure = failure.replaced(message=f"compensation step {task.current_step} failed: {failure.message}; "
                                               f"{task.failure_reason}")
        if not isinstance(exc, ToolFailure):
            logger.exception("task %s: step %s raised; treated as %s", task.pk, task.current_step,
                             failure.error_class)
        return failure

    def _failed(self, run: StepRun | None, exc: Exception, *, compensating: bool = False) -> Outcome:
        task = self.task
        failure = self._classified(exc, compensating=compensating)
        if isinstance(exc, Held):
            # Paused, or its downstream's breaker is open: the task waits, visibly (its status says why),
            # and goes on when it may; no attempt is spent on it.
            delay = exc.retry_after or HELD_RETRY_SECONDS
            if state.retry_later(task, self.owner, exc, delay, waited_by_worker=False, run=run, counted=False):
                return f"held: {exc.message}", None
        elif failure.retryable and task.attempts < task.max_attempts:
            delay = max(failure.retry_after or 0.0, self.pipeline.retry.backoff(task.attempts))
            wait_here = delay <= conf().task_inline_retry_max_seconds
            if state.retry_later(task, self.owner, failure, delay, waited_by_worker=wait_here, run=run):
                return f"retrying after {delay:.2f}s", (delay if wait_here else None)
        elif failure.retryable:
            failure = Transient(f"{failure.message} (gave up after {task.attempts} attempts)")
            if state.fail(task, self.owner, failure, run):
                return "failed", None
        elif state.fail(task, self.owner, failure, run):
            return "failed", None
        if run is not None:
            state.finish_step_run(run, StepOutcome.INTERRUPTED)
        return "interrupted", None
