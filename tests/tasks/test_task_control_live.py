"""Operator and agent control of running tasks over MCP, with real django-q2 workers that are SIGKILLed
where a crash is the point: a pause pending when the worker dies, a completion webhook whose task's worker
died, and a fork run by a worker.
"""

from collections import Counter
from io import StringIO

import pytest
from django.core.management import call_command

from idemops_demo.models import Document
from tests.support.documents_fixtures import long_text, pdf_of_text
from tests.support.mcp_client import call_sync, error_of
from tests.support.processes import WebServer, Worker, downstream_env
from tests.support.task_stack import stack_env, wait_until
from tools_app import tasks
from tools_app.models import AuditEvent, OutboxEvent, StepRun, Task, TaskStatus

# Each test's workers are stopped before the database is flushed (`workers` comes after transactional_db);
# settle_tasks does not apply: a killed worker's step run stays unfinished for good.
pytestmark = pytest.mark.live

STEP = "extract_text"


@pytest.fixture(scope="module")
def control_env(doc_dir, doc_server, _gateway, _sink):
    return {**stack_env(doc_dir, doc_server), **downstream_env(_gateway, _sink), "IDEMOPS_Q_WORKERS": "1"}


@pytest.fixture(scope="module")
def control_web(django_db_setup, django_db_blocker, control_env):
    with django_db_blocker.unblock():
        server = WebServer(name="web-control", **control_env)
    yield server
    server.stop()


@pytest.fixture
def workers(transactional_db, control_env):
    started = []

    def start(name):
        worker = Worker(name=name, **control_env)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop(grace=3)


def big_pdf(doc_dir, name: str, chars: int) -> str:
    path = doc_dir / name
    if not path.exists():
        path.write_bytes(pdf_of_text(long_text(chars), title=name))
    return str(path)


def refreshed(task) -> Task:
    task.refresh_from_db()
    return task


def inside_the_step(task) -> bool:
    return refreshed(task).current_step == STEP and (task.progress_done or 0) >= 5


def sweep_expired_a_lease() -> bool:
    """The dead worker's lease was expired: by this sweep, or by the one in a live worker's loop."""
    out = StringIO()
    call_command("sweep_tasks", stdout=out)
    return "expired leases: 1" in out.getvalue() or AuditEvent.objects.filter(action="task.lease_expired").exists()


def start_task(web, token, arguments, key, **extra) -> Task:
    result = call_sync(web.mcp_url, token, "start_task",
                       {"tool": "ingest_document", "arguments": arguments, "idempotency_key": key, **extra})
    assert not result.is_error, result.structured_content
    return Task.objects.get(pk=result.structured_content["task_id"])


def test_a_task_whose_worker_is_killed_with_a_pause_pending_pauses_on_the_next_worker_before_any_step(
        control_web, workers, token, doc_dir):
    # given a task inside its text extraction on worker A
    worker_a = workers("pause-a")
    task = start_task(control_web, token, {"path": big_pdf(doc_dir, "pause-crash.pdf", 1_500_000)}, "pause-crash")
    wait_until(lambda: inside_the_step(task), timeout=120, what="worker A to be inside extract_text")

    # when the agent pauses it (the step goes on), then worker A is SIGKILLed and worker B takes the task over
    asked = call_sync(control_web.mcp_url, token, "pause_task", {
        "task_id": str(task.pk), "reason": "the customer sent a corrected file", "idempotency_key": "pause-crash-p"})
    worker_a.kill()
    workers("pause-b")
    wait_until(sweep_expired_a_lease, timeout=30, what="the sweep to expire worker A's lease")
    wait_until(lambda: refreshed(task).status == TaskStatus.PAUSED, timeout=60, what="the task to pause")

    # then the request was recorded at once, and worker B paused the task before running anything
    assert (asked.structured_content["status"], asked.structured_content["pause_requested"]) == (
        "running", "the customer sent a corrected file")
    assert (task.pause_reason, task.current_step) == ("the customer sent a corrected file", STEP)
    runs = list(StepRun.objects.filter(task=task).values_list("step", "outcome"))
    assert runs == [("receive", "succeeded"), ("detect_format", "succeeded"), (STEP, "running")]  # A's, killed
    status = call_sync(control_web.mcp_url, token, "get_task_status", {"task_id": str(task.pk)}).structured_content
    assert (status["status"], status["retryable"]) == ("paused", True)

    # and resuming it runs the killed step again and the rest once
    call_sync(control_web.mcp_url, token, "resume_task", {"task_id": str(task.pk), "idempotency_key": "pause-crash-r"})
    wait_until(lambda: refreshed(task).status == TaskStatus.SUCCEEDED, timeout=240, what="the task to succeed")
    assert Counter(StepRun.objects.filter(task=task).values_list("step", flat=True)) == Counter(
        {"receive": 1, "detect_format": 1, STEP: 2, "chunk": 1, "index": 1, "embed": 1, "summarize": 1})


def test_the_webhook_of_a_task_whose_worker_was_killed_is_sent_once_when_the_task_finishes(
        control_web, workers, token, doc_dir, sink):
    # given a task with a webhook, inside its text extraction on worker A
    worker_a = workers("hook-a")
    task = start_task(control_web, token, {"path": big_pdf(doc_dir, "hook-crash.pdf", 1_500_000)}, "hook-crash",
                      notify_url=f"{sink.url}/webhooks/tasks")
    wait_until(lambda: inside_the_step(task), timeout=120, what="worker A to be inside extract_text")

    # when worker A is SIGKILLed: nothing is sent for an unfinished task
    worker_a.kill()
    assert not OutboxEvent.objects.exists() and sink.messages() == {}

    # and worker B resumes it to the end
    workers("hook-b")
    wait_until(sweep_expired_a_lease, timeout=30, what="the sweep to expire worker A's lease")
    wait_until(lambda: refreshed(task).status == TaskStatus.SUCCEEDED, timeout=240, what="the task to succeed")
    messages = wait_until(sink.messages, timeout=60, what="the webhook")

    # then the receiver got exactly one notice, under the outbox event's id
    event = OutboxEvent.objects.get()
    assert event.kind == tasks.WEBHOOK_KIND and messages == {str(event.id): 1}
    wait_until(lambda: OutboxEvent.objects.get(pk=event.pk).status == "delivered", what="the event marked delivered")
    assert event.payload["json"]["status"] == "succeeded" and event.payload["json"]["task_id"] == str(task.pk)


def test_an_agent_forks_a_finished_task_over_mcp_and_a_worker_runs_only_the_steps_from_there(
        control_web, workers, token):
    workers("fork-worker")
    original = start_task(control_web, token, {"text": "# Rates\n\nBerth fees rise in May. Pilots are scarce."},
                          "fork-original")
    wait_until(lambda: refreshed(original).status == TaskStatus.SUCCEEDED, timeout=120, what="the original to end")

    forked = call_sync(control_web.mcp_url, token, "fork_task", {
        "task_id": str(original.pk), "from_step": "index", "reason": "re-index after the analyser change",
        "idempotency_key": "fork-live"})
    fork_id = forked.structured_content["task_id"]
    result = call_sync(control_web.mcp_url, token, "get_task_result", {"task_id": fork_id, "wait_seconds": 60})

    assert not result.is_error, result.structured_content
    fork = Task.objects.get(pk=fork_id)
    assert (fork.forked_from_id, fork.status) == (original.pk, TaskStatus.SUCCEEDED)
    assert list(StepRun.objects.filter(task=fork).values_list("step", flat=True)) == ["index", "embed", "summarize"]
    assert result.structured_content["result"]["document_id"] == Document.objects.get(task=fork).pk
    status = call_sync(control_web.mcp_url, token, "get_task_status", {"task_id": fork_id}).structured_content
    assert (status["forked_from"], status["forked_at_step"]) == (str(original.pk), "index")
    assert AuditEvent.objects.filter(object_id=str(original.pk), action="task.fork_created").count() == 1


def test_a_fork_of_a_task_of_another_tenant_is_not_found(control_web, token, other_token):
    theirs = start_task(control_web, other_token, {"text": "Globex only."}, "theirs")

    refused = call_sync(control_web.mcp_url, token, "fork_task", {
        "task_id": str(theirs.pk), "from_step": "index", "idempotency_key": "steal"})

    assert error_of(refused)["class"] == "not_found" and Task.objects.count() == 1
