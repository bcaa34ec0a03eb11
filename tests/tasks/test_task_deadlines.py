"""Task deadlines (issue 36, item 7): a long task not done by its deadline ends, failed with the reason,
and its key's retention counts from that end, so no key is held forever by a task nobody finishes. And a
control (cancel, pause, resume) that loses its race with the worker answers `transient`, never a final
answer stored under its key.

Against real PostgreSQL; time passes as the database sees it (a deadline is moved back, as
test_task_keys moves stored times back); the last test runs the real job cluster, whose loop sweeps.
"""

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.db import connection, connections
from django.db.models import F

from idemops_demo.tools.documents import INGEST
from tests.support.processes import Worker, free_port
from tests.support.task_stack import wait_until
from tests.support.tasks_support import TEXT, agent, start
from tools_app import tasks
from tools_app.conf import override_conf
from tools_app.core import clock
from tools_app.core.errors import ErrorClass
from tools_app.engine.models import IdempotencyRecord, RecordStatus
from tools_app.models import AuditEvent, Checkpoint, StepRun, Task, TaskStatus
from tools_app.tasks import agent_view, control, state
from tools_app.tasks import jobs as task_jobs
from tools_app.toolkit.calls import call_tool
from tools_app.toolkit.pipelines import Pipeline, Step
from tools_app.toolkit.registry import get_tool

WEEK = timedelta(days=7)


def deadline_passes(task: Task) -> None:
    """The database's clock moves past the task's deadline (its deadline moves back to a second ago)."""
    Task.objects.filter(pk=task.pk).update(deadline_at=clock.NOW - timedelta(seconds=1))


def counts_from_the_end(task: Task) -> bool:
    """The task's key is no longer held, and its retention counts from the task's end (set in the
    end's transaction, a statement after finished_at: not before it, and not later than now)."""
    retention = state.key_retention(task.tool)
    record = task.record
    return not record.ongoing and task.finished_at + retention <= record.expires_at <= clock.read() + retention


def fetched(task: Task) -> Task:
    return Task.objects.select_related("record").get(pk=task.pk)


# --- the deadline a task gets --------------------------------------------------------------------


def test_a_task_gets_its_tools_deadline_from_its_start(caller, fast):
    task = fetched(start(caller, {"text": TEXT}))

    assert task.time_allowed == WEEK  # ingest_document declares none: IDEMOPS_TASK_DEADLINE_SECONDS
    assert task.deadline_at - task.created_at == WEEK


def test_a_caller_asking_for_a_shorter_deadline_gets_it_and_a_longer_one_gets_the_tools(caller, fast):
    spec = get_tool("ingest_document")

    _, shorter = agent_view.start_through_engine(spec, caller, {"text": TEXT}, "short", timedelta(minutes=5))
    _, longer = agent_view.start_through_engine(spec, caller, {"text": TEXT}, "long", timedelta(days=30))

    assert (shorter.time_allowed, shorter.deadline_at - shorter.created_at) == (timedelta(minutes=5),) * 2
    assert (longer.time_allowed, longer.deadline_at - longer.created_at) == (WEEK, WEEK)


def test_a_long_tool_declares_its_own_deadline_and_a_pipeline_refuses_one_that_is_not_positive(fast):
    pipeline = Pipeline(steps=INGEST.steps, deadline=timedelta(hours=2))

    assert pipeline.time_allowed() == timedelta(hours=2)
    assert pipeline.time_allowed(timedelta(hours=1)) == timedelta(hours=1)
    assert pipeline.time_allowed(timedelta(hours=3)) == timedelta(hours=2)
    with pytest.raises(ValueError, match="deadline must be positive"):
        Pipeline(steps=(Step("only", print),), deadline=timedelta(0))


# --- the end at the deadline ---------------------------------------------------------------------


def test_a_paused_task_nobody_resumes_ends_at_its_deadline_and_its_key_counts_from_that_end(caller, fast):
    # given a task paused by its agent, which nobody resumes
    task = start(caller, {"text": TEXT})
    tasks.pause(task, agent(caller), reason="the customer checks the file")
    assert task_jobs.sweep()["past_deadline"] == 0  # before its deadline, the sweep leaves it alone
    assert fetched(task).record.ongoing

    # when its deadline passes and the sweep runs
    deadline_passes(task)
    counts = task_jobs.sweep()

    # then it ended, failed (transient) with a reason naming its deadline, audited as such
    task = fetched(task)
    assert counts["past_deadline"] == 1
    assert (task.status, task.failure_class) == (TaskStatus.FAILED, ErrorClass.TRANSIENT)
    assert "deadline passed" in task.failure_reason and "7 d" in task.failure_reason
    assert "was still paused" in task.failure_reason
    event = AuditEvent.objects.get(object_id=str(task.pk), action="task.deadline_passed")
    assert (event.actor, event.before["status"], event.after["status"]) == (
        tasks.TASK_SWEEPER, TaskStatus.PAUSED, TaskStatus.FAILED)
    # and its key is no longer held: its retention counts from that end
    assert counts_from_the_end(task)
    assert AuditEvent.objects.filter(object_id=str(task.record.pk), action="record.retention_from_end").exists()
    # and a second sweep finds nothing more to end
    assert task_jobs.sweep()["past_deadline"] == 0


def test_resume_runs_a_task_its_deadline_ended_again_with_as_long_again_and_holds_its_key_again(caller, fast):
    spec = get_tool("ingest_document")
    _, task = agent_view.start_through_engine(spec, caller, {"text": TEXT}, "k-resume", timedelta(minutes=5))
    deadline_passes(task)
    task_jobs.sweep()
    task = fetched(task)
    assert task.status == TaskStatus.FAILED and state.resumable(task)

    tasks.resume(task, agent(caller))

    task = fetched(task)
    assert (task.status, task.time_allowed) == (TaskStatus.CREATED, timedelta(minutes=5))
    assert task.deadline_at - clock.read() <= timedelta(minutes=5) < task.deadline_at - task.created_at
    assert task.record.ongoing
    assert task_jobs.run_task(str(task.pk)) == "succeeded"


def test_a_worker_ends_its_task_at_a_step_boundary_once_the_deadline_passed_and_starts_no_step(
        transactional_db, caller, fast):
    task = start(caller, {"text": TEXT})
    deadline_passes(task)

    outcome = task_jobs.run_task(str(task.pk))

    task = fetched(task)
    assert outcome == "failed: its deadline passed"
    assert (task.status, task.failure_class) == (TaskStatus.FAILED, ErrorClass.TRANSIENT)
    assert not StepRun.objects.filter(task=task).exists()
    # by the worker that took it, not by the sweep
    taken = AuditEvent.objects.get(object_id=str(task.pk), action="task.taken")
    assert AuditEvent.objects.get(object_id=str(task.pk), action="task.deadline_passed").actor == taken.actor
    assert not task.record.ongoing


def test_a_task_that_finished_before_its_deadline_is_left_as_it_is(transactional_db, caller, fast):
    task = start(caller, {"text": TEXT})
    assert task_jobs.run_task(str(task.pk)) == "succeeded"
    deadline_passes(task)

    assert task_jobs.sweep()["past_deadline"] == 0
    assert fetched(task).status == TaskStatus.SUCCEEDED


# --- a control that loses its race -----------------------------------------------------------------


@contextmanager
def a_worker_moves_the_task_after_every_read(task: Task) -> Iterator[list[int]]:
    """Another connection (a worker's) changes the task, committed, right after each read of it this
    connection makes: the guarded UPDATE that follows the read then finds a newer version and matches
    nothing, as when a worker moves the task on between a control's read and its update."""
    other = connections.create_connection("default")
    moves: list[int] = []

    def move_after(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if sql.lstrip().startswith("SELECT") and 'FROM "tools_app_task"' in sql:
            with other.cursor() as cursor:
                cursor.execute("UPDATE tools_app_task SET version = version + 1 WHERE id = %s", [task.pk])
            moves.append(1)
        return result

    try:
        with connection.execute_wrapper(move_after):
            yield moves
    finally:
        other.close()


def cancel_with_key(caller, task: Task, key: str):
    return call_tool(get_tool("cancel_task"), caller,
                     {"task_id": str(task.pk), "reason": "not needed", "idempotency_key": key})


def test_a_cancel_that_loses_its_race_every_round_answers_transient_and_the_same_key_then_cancels(
        transactional_db, caller, fast):
    task = start(caller, {"text": TEXT})

    # when a worker moves the task on between each of the cancel's reads and its update
    with a_worker_moves_the_task_after_every_read(task) as moves:
        lost = cancel_with_key(caller, task, "cancel-1")

    # then the cancel answers transient with a retry_after, nothing was changed, and its key's
    # outcome is a failure the same key may run again, not a final answer
    assert len(moves) >= control.OPTIMISTIC_ROUNDS
    assert lost.error is not None and lost.error.error_class == ErrorClass.TRANSIENT
    assert lost.error.retry_after is not None and lost.error.retry_after > 0
    assert fetched(task).status == TaskStatus.CREATED
    record = IdempotencyRecord.objects.get(pk=lost.record.pk)
    assert (record.status, record.error_class) == (RecordStatus.FAILED, ErrorClass.TRANSIENT)

    # when its retry_after has passed (as the database sees it) and the agent retries with the same key
    IdempotencyRecord.objects.filter(pk=record.pk).update(retry_not_before=F("retry_not_before") - timedelta(hours=1))
    retried = cancel_with_key(caller, task, "cancel-1")

    # then the cancel ran again, and this time it cancelled the task
    assert retried.error is None, retried.error
    assert retried.result["status"] == TaskStatus.CANCELLED and fetched(task).status == TaskStatus.CANCELLED
    assert IdempotencyRecord.objects.get(pk=record.pk).status == RecordStatus.SUCCEEDED


# --- the real job cluster: a step that blocks past the deadline --------------------------------------


class HeldResponses:
    """An HTTP server whose answers wait until released: a document fetch that blocks its step."""

    def __init__(self) -> None:
        self.released = threading.Event()
        self.asked = threading.Event()
        port = free_port()
        self.base_url = f"http://127.0.0.1:{port}/docs/"
        held = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                held.asked.set()
                held.released.wait(120)
                body = TEXT.encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.released.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def held():
    server = HeldResponses()
    yield server
    server.close()


@pytest.mark.live
def test_a_task_whose_step_blocks_past_its_deadline_is_ended_by_the_clusters_sweep_and_its_worker_stops(
        transactional_db, settings, caller, fast, held):
    # given a cluster (its loop sweeps every second) running a task whose first step waits on a fetch
    override_conf(settings, document_allowed_url_prefixes=[held.base_url])
    worker = Worker(name="workers-deadline", IDEMOPS_DOCUMENT_ALLOWED_URL_PREFIXES=held.base_url,
                    IDEMOPS_TASK_LEASE_SECONDS="2", IDEMOPS_TASK_HEARTBEAT_SECONDS="0.3", IDEMOPS_Q_WORKERS="1")
    try:
        task = start(caller, {"url": held.base_url + "slow.txt"}, key="blocked")
        assert held.asked.wait(60), "the worker never fetched the document"
        assert fetched(task).current_step == "receive"

        # when its deadline passes while the step is still blocked
        deadline_passes(task)

        # then the cluster's sweep ends it, failed with the reason, and its key counts from that end
        wait_until(lambda: fetched(task).status == TaskStatus.FAILED, timeout=60, what="the sweep to end the task")
        task = fetched(task)
        assert task.failure_class == ErrorClass.TRANSIENT
        assert "deadline passed" in task.failure_reason and "at step 'receive'" in task.failure_reason
        assert AuditEvent.objects.get(object_id=str(task.pk), action="task.deadline_passed").actor == \
            tasks.TASK_SWEEPER
        assert counts_from_the_end(task)

        # and once the blocked fetch returns, its worker writes nothing more: the step run was interrupted
        held.released.set()
        run = wait_until(lambda: StepRun.objects.filter(task=task, step="receive", finished_at__isnull=False).first(),
                         timeout=60, what="the blocked step run to finish")
        assert run.outcome == "interrupted"
        assert not Checkpoint.objects.filter(task=task).exists()
        assert fetched(task).status == TaskStatus.FAILED
    finally:
        held.released.set()
        worker.stop(grace=3)
