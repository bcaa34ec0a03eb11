"""A worker SIGKILLed in the middle of a step: the task resumes on another worker.

Real `manage.py qcluster` processes against the test database. Worker A is
killed (its whole process group, no cleanup) while it is inside step k
(extract_text, a long PDF read page by page); once its lease has expired the
sweep in worker B's loop (every second, nobody runs it by hand) hands the task
on, and worker B resumes it from the checkpoints.
"""

from collections import Counter

import pytest

from idemops_demo.models import Document
from tests.support.documents_fixtures import long_text, pdf_of_text
from tests.support.processes import Worker
from tests.support.task_stack import wait_until
from tools_app import access
from tools_app.conf import override_conf
from tools_app.models import AuditEvent, Checkpoint, StepRun, Task, TaskStatus
from tools_app.toolkit.calls import Caller, call_tool
from tools_app.toolkit.registry import get_tool

pytestmark = pytest.mark.live

CRASH_STEP = "extract_text"
ENV = {"IDEMOPS_TASK_LEASE_SECONDS": "2", "IDEMOPS_TASK_HEARTBEAT_SECONDS": "0.3", "IDEMOPS_Q_WORKERS": "1"}


@pytest.fixture
def workers(doc_dir):
    started = []

    def start(name):
        worker = Worker(name=name, IDEMOPS_DOCUMENT_ALLOWED_DIRS=str(doc_dir), **ENV)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop(grace=3)


def start_ingest(caller, path, key) -> Task:
    result = call_tool(get_tool("start_task"), caller,
                       {"tool": "ingest_document", "arguments": {"path": path}, "idempotency_key": key})
    assert result.error is None, result.error
    return Task.objects.get(pk=result.result["task_id"])


def refreshed(task) -> Task:
    task.refresh_from_db()
    return task


def comparable(task) -> dict:
    document = Document.objects.get(task=task)
    result = {k: v for k, v in task.result.items() if k != "document_id"}
    return {"result": result, "chunks": list(document.chunks.order_by("seq").values_list("text", flat=True))}


def test_a_worker_killed_inside_a_step_resumes_on_another_worker_from_its_checkpoints(
        transactional_db, settings, doc_dir, workers):
    # given a long PDF being ingested by worker A, which is inside step k (extract_text)
    override_conf(settings, document_allowed_dirs=[str(doc_dir)])
    tenant = access.create_tenant("acme", "ACME")
    caller = Caller(tenant_id=tenant.pk, actor="agent:acme/test")
    path = doc_dir / "crash.pdf"
    path.write_bytes(pdf_of_text(long_text(2_000_000), title="Crash"))
    worker_a = workers("crash-a")
    task = start_ingest(caller, str(path), "crash-1")
    wait_until(lambda: refreshed(task).current_step == CRASH_STEP and (task.progress_done or 0) >= 20,
               timeout=120, what="worker A to be 20 pages into extract_text")

    # when worker A is SIGKILLed and worker B starts
    worker_a.kill()
    killed_run = StepRun.objects.get(task=task, step=CRASH_STEP)
    assert killed_run.finished_at is None and not Checkpoint.objects.filter(task=task, step=CRASH_STEP).exists()
    assert refreshed(task).status == TaskStatus.RUNNING
    workers("crash-b")
    # (well within the one-minute schedule: worker B's loop sweeps every second)
    wait_until(lambda: AuditEvent.objects.filter(object_id=str(task.pk), action="task.lease_expired").exists(),
               timeout=20, what="worker B's loop to expire worker A's lease")
    wait_until(lambda: refreshed(task).status == TaskStatus.SUCCEEDED, timeout=240, what="the task to succeed")

    # then the steps before k ran once, step k twice (the killed run and the resumed one), the rest once
    runs = list(StepRun.objects.filter(task=task).order_by("started_at").values_list("step", "worker", "outcome"))
    assert Counter(step for step, _, _ in runs) == Counter(
        {"receive": 1, "detect_format": 1, CRASH_STEP: 2, "chunk": 1, "index": 1, "embed": 1, "summarize": 1})
    crashed, resumed = [(worker, outcome) for step, worker, outcome in runs if step == CRASH_STEP]
    assert crashed[1] == "running" and resumed[1] == "succeeded"  # the killed run never finished
    assert crashed[0].split(":")[1] != resumed[0].split(":")[1]  # another worker process took over
    assert AuditEvent.objects.filter(object_id=str(task.pk), action="task.lease_expired").count() == 1
    assert (task.attempts, task.lease_expiries) == (1, 1)  # a crash is not a failed attempt

    # and the result is identical to an uninterrupted run's
    reference = start_ingest(caller, str(path), "crash-reference")
    wait_until(lambda: refreshed(reference).status == TaskStatus.SUCCEEDED, timeout=240,
               what="the uninterrupted run to succeed")
    assert Counter(StepRun.objects.filter(task=reference).values_list("step", flat=True)) == Counter(
        dict.fromkeys(["receive", "detect_format", CRASH_STEP, "chunk", "index", "embed", "summarize"], 1))
    assert comparable(task) == comparable(reference)
    assert task.result["chunks"] > 1000


def test_a_queued_task_whose_cluster_died_holding_its_job_starts_again_within_its_lease_and_grace(
        transactional_db, settings, doc_dir):
    from tests.support.task_stack import lost_job
    from tools_app.core.models import MetricTotal

    # given a cluster holding a queued task's job (its only worker busy with a long PDF), SIGKILLed
    override_conf(settings, document_allowed_dirs=[str(doc_dir)])
    tenant = access.create_tenant("acme", "ACME")
    caller = Caller(tenant_id=tenant.pk, actor="agent:acme/test")
    path = doc_dir / "lost.pdf"
    path.write_bytes(pdf_of_text(long_text(2_000_000), title="Busy"))
    env = {**ENV, "IDEMOPS_TASK_REQUEUE_AFTER_SECONDS": "1", "IDEMOPS_DOCUMENT_ALLOWED_DIRS": str(doc_dir)}

    # when the standby cluster runs on (lost_job waits, up to two minutes, for the task to succeed there)
    lost, _, busy = lost_job(caller, path, env, "lost-job", "lost")

    # then the sweep queued it again once, as a lost job, before a worker took it again: it did not wait for
    # django-q2's retry (720 s) to hand the dead cluster's job out again (how soon it started is bench/'s
    # bench_lost_jobs.py to measure: a loaded machine must not turn this red)
    requeued = AuditEvent.objects.filter(object_id=str(lost.pk), action="task.requeued")
    assert [event.after["job_lost"] for event in requeued] == [True]
    taken = AuditEvent.objects.filter(object_id=str(lost.pk), action="task.taken").order_by("id")
    assert taken.count() == 1 and taken.get().id > requeued.get().id
    # and it was counted; and each of its steps ran once
    assert Counter(StepRun.objects.filter(task=lost).values_list("step", flat=True)) == Counter(
        dict.fromkeys(["receive", "detect_format", CRASH_STEP, "chunk", "index", "embed", "summarize"], 1))
    # (the cluster's flusher writes its counts within a second of counting them)
    wait_until(lambda: MetricTotal.objects.filter(metric="task_job_lost", tool="ingest_document").exists(),
               what="the lost job counted")
    assert MetricTotal.objects.filter(metric="task_job_lost", tool="ingest_document").get().count == 1
    assert refreshed(busy).lease_expiries == 1  # the busy task's worker died with its cluster
