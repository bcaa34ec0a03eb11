"""A step's bookkeeping is one statement: counted in libpq's trace of the runner's connection.

Between two steps the runner writes the task's move (its lease renewed, the next step named), its
audit event, the step's checkpoint, the finished StepRun and the next one: one statement
(tasks.complete_step), which also checks that no pause was asked for and the deadline has not
passed. So a pipeline with more steps costs the runner exactly one round trip more per step.
"""

import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from pydantic import BaseModel

from idemops.tools import Pipeline, Step, WriteInput, long_tool
from tests.support.round_trips import round_trips
from tools_app import tasks
from tools_app.models import AuditEvent, Checkpoint, StepOutcome, StepRun, Task, TaskStatus
from tools_app.tasks import jobs as task_jobs
from tools_app.tasks import state
from tools_app.toolkit import registry
from tools_app.toolkit.calls import call_tool
from tools_app.toolkit.registry import get_tool

pytestmark = pytest.mark.django_db(transaction=True)


class CountInput(WriteInput):
    size: int = 10


class CountOutput(BaseModel):
    steps: int


def step(number: int, steps: int):
    def run(ctx):
        return {"steps": steps} if number == steps - 1 else {"step": number, "pad": "x" * ctx.arguments.size}
    return run


@pytest.fixture
def counting_tools(monkeypatch):
    """Two long tools for this test only: 3 and 8 steps that do nothing."""
    monkeypatch.setattr(registry, "_TOOLS", dict(registry._TOOLS))
    for steps in (3, 8):
        long_tool(name=f"count_{steps}", title="Count", description="Count.", input_model=CountInput,
                  output_model=CountOutput, personal_fields=frozenset(),
                  pipeline=Pipeline(steps=tuple(Step(f"s{n}", step(n, steps)) for n in range(steps))))


def started(caller, tool: str) -> str:
    answer = call_tool(get_tool("start_task"), caller, {"tool": tool, "arguments": {},
                                                       "idempotency_key": uuid.uuid4().hex})
    assert answer.error is None, answer.error
    return answer.result["task_id"]


def test_each_step_more_costs_the_runner_one_round_trip_and_leaves_its_whole_history(counting_tools, caller,
                                                                                    fast):
    for _ in range(2):  # settings read, statements prepared (psycopg prepares one on its 5th run: a round trip more)
        task_jobs.run_task(started(caller, "count_8"))
    trips = {}
    for steps in (3, 8):
        task_id = started(caller, f"count_{steps}")
        trips[steps] = round_trips(lambda task_id=task_id: task_jobs.run_task(task_id))
        task = Task.objects.get(pk=task_id)
        assert task.status == TaskStatus.SUCCEEDED and task.result == {"steps": steps}
        # Nothing of a step is left out of its one statement: its checkpoint, its closed StepRun, its event.
        assert Checkpoint.objects.filter(task=task).count() == steps
        runs = StepRun.objects.filter(task=task)
        assert [r.step for r in runs.order_by("sequence")] == [f"s{n}" for n in range(steps)]
        assert all(r.outcome == StepOutcome.SUCCEEDED and r.finished_at and r.started_at <= r.finished_at
                   for r in runs)
        assert AuditEvent.objects.filter(object_id=task_id, action="task.step_completed").count() == steps

    assert len(trips[8]) - len(trips[3]) == 5, (trips[3], trips[8])


def test_a_step_run_begun_with_its_task_move_reads_its_start_from_the_row(counting_tools, caller, fast):
    task = tasks.take(started(caller, "count_3"), "worker-a")
    run = tasks.begin_step(task, "worker-a", Step("s0", step(0, 3)), 0, completed=[])
    assert run.started_at == StepRun.objects.get(pk=run.pk).started_at is not None
    assert (run.task_id, run.step, run.sequence, run.worker, run.outcome) == (task.pk, "s0", 0, "worker-a",
                                                                            StepOutcome.RUNNING)


def test_a_task_with_no_step_done_starts_without_reading_checkpoints(counting_tools, caller, fast):
    fresh = started(caller, "count_3")
    with CaptureQueriesContext(connection) as queries:
        assert task_jobs.run_task(fresh) == "succeeded"
    reads = [q["sql"] for q in queries if q["sql"].startswith("SELECT") and 'FROM "tools_app_checkpoint"' in q["sql"]]
    assert reads == []

    # A task with steps done reads them and reuses them: tests/tasks/test_task_crash.py and test_long_tools_crash.py.


def test_a_tasks_end_moves_its_key_in_its_own_statement_each_audited(counting_tools, caller, fast):
    task = tasks.take(started(caller, "count_3"), "worker-a")
    record = task.record
    assert record.ongoing

    # Not the lease's owner: neither the task nor its key moves, and nothing is audited.
    assert not state.succeed(task, "worker-b", {"steps": 3})
    record.refresh_from_db()
    assert record.ongoing and Task.objects.get(pk=task.pk).status == TaskStatus.RUNNING
    assert not AuditEvent.objects.filter(object_id=str(record.pk), action="record.retention_from_end").exists()

    # Its owner: one round trip moves both, each with its audit event.
    trips = round_trips(lambda: state.succeed(task, "worker-a", {"steps": 3}))
    assert trips == ["Sync"], trips
    ended = Task.objects.select_related("record").get(pk=task.pk)
    retention = state.key_retention("count_3")
    assert ended.status == TaskStatus.SUCCEEDED and not ended.record.ongoing
    assert ended.finished_at + retention <= ended.record.expires_at <= ended.finished_at + retention + timedelta(
        seconds=1)
    assert AuditEvent.objects.filter(object_id=str(task.pk), action="task.succeeded").count() == 1
    event = AuditEvent.objects.get(object_id=str(record.pk), action="record.retention_from_end")
    assert (event.actor, event.before, event.after["ongoing"]) == ("worker-a", {"ongoing": True}, False)
    # The object in hand says so too (the database's time read on use).
    assert not task.record.ongoing and task.record.expires_at == ended.record.expires_at
