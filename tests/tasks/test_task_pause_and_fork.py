"""Operator control of a running task (pause at a step boundary, fork from step N), its change notices and
its completion webhook, in-process against real PostgreSQL (jobs run by calling the job function)."""

import re
import threading
from datetime import timedelta

import psycopg
import pytest
from django.db import connections, transaction
from django.urls import reverse
from django.utils import timezone

from idemops_demo import documents
from idemops_demo.models import Document
from tests.support import processes
from tests.support.operators import make_operator
from tests.support.tasks_support import TEXT, agent, start
from tools_app import tasks
from tools_app.access.roles import AUDITOR, OPERATOR
from tools_app.conf import override_conf
from tools_app.models import AuditEvent, Checkpoint, OutboxEvent, StepOutcome, StepRun, Task, TaskArtifact, TaskStatus
from tools_app.tasks import jobs as task_jobs
from tools_app.toolkit.calls import call_tool
from tools_app.toolkit.registry import get_tool

STEPS = ["receive", "detect_format", "extract_text", "chunk", "index", "embed", "summarize"]


def steps_run(task) -> list[str]:
    return list(StepRun.objects.filter(task=task).order_by("started_at", "id").values_list("step", flat=True))


def events(task) -> list[str]:
    return list(AuditEvent.objects.filter(object_id=str(task.pk)).order_by("id").values_list("action", flat=True))


# --- pause: a running task stops at its next step boundary -----------------------------------------------


def test_a_pause_asked_of_a_running_task_lets_its_step_finish_and_pauses_before_the_next(
        transactional_db, caller, fast, tenant, monkeypatch):
    # given a task inside its text extraction in a worker thread, held there until the test lets it go on
    inside, go_on = threading.Event(), threading.Event()
    extract = documents.extract

    def held_extract(*args, **kwargs):
        inside.set()
        assert go_on.wait(timeout=120), "the test never let the step go on"
        return extract(*args, **kwargs)

    monkeypatch.setattr(documents, "extract", held_extract)
    task = start(caller, {"text": TEXT})
    outcome = []

    def worker():
        try:
            outcome.append(task_jobs.run_task(str(task.pk)))
        finally:
            connections.close_all()

    thread = threading.Thread(target=worker)
    thread.start()
    assert inside.wait(timeout=60), "the worker never reached extract_text"

    # when an operator pauses it
    asked = tasks.pause(Task.objects.get(pk=task.pk), make_operator("olga", OPERATOR, tenant),
                        reason="the customer wants to check the file")
    go_on.set()
    thread.join(timeout=120)

    # then it went on running until the step was done and checkpointed, and paused before the next one
    assert (asked.status, asked.pause_requested) == (TaskStatus.RUNNING, "the customer wants to check the file")
    assert outcome == ["paused before step chunk, as asked"]
    task.refresh_from_db()
    assert (task.status, task.pause_reason, task.pause_requested) == (
        TaskStatus.PAUSED, "the customer wants to check the file", "")
    assert (task.current_step, task.lease_owner) == ("chunk", "")
    assert steps_run(task) == STEPS[:3]
    assert StepRun.objects.get(task=task, step="extract_text").outcome == StepOutcome.SUCCEEDED
    assert Checkpoint.objects.filter(task=task).count() == 3
    assert AuditEvent.objects.get(object_id=str(task.pk), action="task.pause_requested").actor == "user:olga"
    paused = AuditEvent.objects.get(object_id=str(task.pk), action="task.paused")
    assert paused.after["step"] == "chunk" and paused.reason == "the customer wants to check the file"

    # and resuming runs the rest, each step once
    tasks.resume(task, agent(caller))
    assert task_jobs.run_task(str(task.pk)) == "succeeded"
    assert steps_run(task) == STEPS


def test_a_task_whose_worker_died_with_a_pause_pending_pauses_before_it_runs_anything_more(caller, fast):
    # given a running task asked to pause, whose worker then died (its lease ran out)
    task = tasks.take(str(start(caller, {"text": TEXT}).pk), "worker-dead")
    tasks.pause(task, agent(caller), reason="hold it")
    Task.objects.filter(pk=task.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))

    # when the sweep hands it to a new job
    assert tasks.sweep()["expired"] == 1
    outcome = task_jobs.run_task(str(task.pk))

    # then that job pauses it at once: no step starts
    assert outcome == "paused before step receive, as asked"
    task.refresh_from_db()
    assert (task.status, task.pause_reason) == (TaskStatus.PAUSED, "hold it")
    assert not StepRun.objects.filter(task=task).exists()


def test_a_task_paused_again_while_queued_with_a_request_pending_runs_once_resumed(caller, fast):
    # given a task whose worker died with a pause pending, queued again by the sweep, then paused while queued
    task = tasks.take(str(start(caller, {"text": TEXT}).pk), "worker-dead")
    tasks.pause(task, agent(caller), reason="first")
    Task.objects.filter(pk=task.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    tasks.sweep()
    paused = tasks.pause(Task.objects.get(pk=task.pk), agent(caller), reason="second")
    assert (paused.status, paused.pause_reason, paused.pause_requested) == (TaskStatus.PAUSED, "second", "")

    # when it is resumed
    tasks.resume(paused, agent(caller))

    # then the old request went with the pause that answered it: the task runs
    assert task_jobs.run_task(str(task.pk)) == "succeeded"


def test_resuming_a_running_task_withdraws_its_pending_pause(caller, fast):
    task = tasks.take(str(start(caller, {"text": TEXT}).pk), "worker-a")
    version = task.version
    tasks.pause(task, agent(caller), reason="hold it")

    resumed = tasks.resume(Task.objects.get(pk=task.pk), agent(caller))

    assert (resumed.status, resumed.pause_requested, resumed.lease_owner) == (TaskStatus.RUNNING, "", "worker-a")
    assert resumed.version == version  # the worker's next write is not refused
    assert events(task)[-2:] == ["task.pause_requested", "task.pause_withdrawn"]
    assert task_jobs.run_task(str(task.pk)).startswith("not taken")  # the lease holder still runs it


def test_an_operator_asks_a_running_task_to_pause_from_the_admin(client, caller, fast, tenant):
    task = tasks.take(str(start(caller, {"text": TEXT}).pk), "worker-a")
    client.force_login(make_operator("olga", OPERATOR, tenant))

    response = client.post(reverse("admin:tools_app_task_act", args=[task.pk, "pause"]),
                           {"reason": "legal review"}, follow=True)

    task.refresh_from_db()
    assert (task.status, task.pause_requested) == (TaskStatus.RUNNING, "legal review")
    assert "pauses when its current step is done" in response.content.decode()


# --- change notices: what the web processes' watchers hear ------------------------------------------------


def test_a_task_transition_notifies_its_id_when_it_commits_and_not_when_it_rolls_back(transactional_db, caller,
                                                                                        fast):
    task = start(caller, {"text": TEXT})
    with psycopg.connect(processes.test_database_url(), autocommit=True) as listener:
        listener.execute(f"LISTEN {tasks.CHANGES_CHANNEL}")

        with pytest.raises(RuntimeError), transaction.atomic():
            tasks.pause(task, agent(caller), reason="rolled back")
            raise RuntimeError("the surrounding transaction fails")
        rolled_back = list(listener.notifies(timeout=0.5))
        tasks.pause(Task.objects.get(pk=task.pk), agent(caller), reason="kept")
        committed = list(listener.notifies(timeout=2, stop_after=1))

    assert rolled_back == []
    assert [(n.channel, n.payload) for n in committed] == [(tasks.CHANGES_CHANNEL, str(task.pk))]


# --- the completion webhook: an outbox event in the transaction of the last transition ---------------------


@pytest.fixture
def webhooks(fast):
    override_conf(fast, webhook_allowed_prefixes=["http://127.0.0.1:9/hooks/"])
    return "http://127.0.0.1:9/hooks/tasks"


def start_with_webhook(caller, url, key="hook"):
    result = call_tool(get_tool("start_task"), caller, {"tool": "ingest_document", "arguments": {"text": TEXT},
                                                        "notify_url": url, "idempotency_key": key})
    assert result.error is None, result.error
    return Task.objects.get(pk=result.result["task_id"])


def test_a_task_that_succeeds_writes_one_webhook_event_with_its_result(caller, webhooks):
    task = start_with_webhook(caller, webhooks)

    assert task_jobs.run_task(str(task.pk)) == "succeeded"

    event = OutboxEvent.objects.get()
    assert (event.kind, event.status, event.record_id) == (tasks.WEBHOOK_KIND, "pending", task.record_id)
    assert event.payload["recipient"] == webhooks
    body = event.payload["json"]
    assert (body["type"], body["task_id"], body["status"]) == ("task.finished", str(task.pk), "succeeded")
    assert body["result"]["document_id"] == Document.objects.get(task=task).pk


def test_a_worker_that_finishes_a_task_already_cancelled_writes_no_second_webhook(caller, webhooks):
    task = start_with_webhook(caller, webhooks)
    mine = tasks.take(str(task.pk), "worker-a")

    tasks.cancel(Task.objects.get(pk=task.pk), agent(caller), reason="not needed")
    assert tasks.succeed(mine, "worker-a", {"document_id": 1}) is False

    event = OutboxEvent.objects.get()
    assert (event.payload["json"]["status"], event.payload["json"]["result"]) == ("cancelled", None)


def test_a_task_without_a_notify_url_writes_no_event(caller, fast):
    task = start(caller, {"text": TEXT})

    assert task_jobs.run_task(str(task.pk)) == "succeeded"
    assert not OutboxEvent.objects.exists()


def test_a_notify_url_off_the_allow_list_is_invalid_input_naming_it(caller, webhooks):
    result = call_tool(get_tool("start_task"), caller, {"tool": "ingest_document", "arguments": {"text": TEXT},
                                                        "notify_url": "http://127.0.0.1:9/elsewhere",
                                                        "idempotency_key": "bad-hook"})

    assert result.error.error_class == "invalid_input" and result.error.message.startswith("notify_url:")
    assert not Task.objects.exists()


# --- fork: re-run from step N in a new task ----------------------------------------------------------------


def finished_task(caller, key="orig") -> Task:
    task = start(caller, {"text": TEXT * 400}, key=key)  # large outputs: some checkpoints hold artifacts
    assert task_jobs.run_task(str(task.pk)) == "succeeded"
    task.refresh_from_db()
    return task


def fork_call(caller, task, from_step, key="fork-1"):
    return call_tool(get_tool("fork_task"), caller, {"task_id": str(task.pk), "from_step": from_step,
                                                     "reason": "the chunker was fixed", "idempotency_key": key})


def test_a_fork_reuses_the_verified_checkpoints_before_its_step_and_runs_the_rest(caller, fast):
    original = finished_task(caller)
    original_steps = steps_run(original)

    # when the agent forks it from `chunk`
    result = fork_call(caller, original, "chunk")

    # then a new task, linked to the original, holds copies of the first three checkpoints and runs from chunk
    assert result.error is None, result.error
    fork = Task.objects.get(pk=result.result["task_id"])
    assert (fork.forked_from_id, fork.forked_at_step, fork.tool) == (original.pk, "chunk", original.tool)
    assert result.result["forked_from"] == str(original.pk) and result.result["from_step"] == "chunk"
    assert fork.record.tool == "fork_task" and fork.completed_steps == STEPS[:3]
    copied = Checkpoint.objects.filter(task=fork).order_by("sequence")
    assert [(c.step, c.checksum) for c in copied] == list(
        Checkpoint.objects.filter(task=original, sequence__lt=3).order_by("sequence").values_list("step", "checksum"))
    assert all(c.artifact is None or c.artifact.task_id == fork.pk for c in copied)
    assert task_jobs.run_task(str(fork.pk)) == "succeeded"
    assert steps_run(fork) == STEPS[3:]
    fork.refresh_from_db()
    assert fork.result["characters"] == original.result["characters"]
    assert fork.result["document_id"] != original.result["document_id"]
    # the original is untouched, and both audit trails tell of the fork
    assert steps_run(original) == original_steps and Task.objects.get(pk=original.pk).status == TaskStatus.SUCCEEDED
    assert "task.fork_created" in events(original)
    forked = AuditEvent.objects.get(object_id=str(fork.pk), action="task.forked")
    assert forked.after == {"forked_from": str(original.pk), "from_step": "chunk", "reused_steps": STEPS[:3]}
    assert forked.reason == "the chunker was fixed"
    # and the same key forks once
    again = fork_call(caller, original, "chunk")
    assert again.replayed and again.result["task_id"] == str(fork.pk) and Task.objects.count() == 2


def test_a_fork_from_the_first_step_reruns_everything(caller, fast):
    original = finished_task(caller)

    fork = Task.objects.get(pk=fork_call(caller, original, "receive").result["task_id"])

    assert not Checkpoint.objects.filter(task=fork).exists()
    assert task_jobs.run_task(str(fork.pk)) == "succeeded" and steps_run(fork) == STEPS


def test_a_fork_past_the_verified_checkpoints_is_refused_naming_where_it_could_start(caller, fast):
    original = finished_task(caller)
    Checkpoint.objects.filter(task=original, step="detect_format").update(checksum="0" * 64)

    refused = fork_call(caller, original, "chunk")
    unknown = fork_call(caller, original, "polish", key="fork-2")

    assert refused.error.error_class == "invalid_input"
    assert "first 1 steps" in refused.error.message and "'detect_format'" in refused.error.message
    assert unknown.error.error_class == "invalid_input" and "no step 'polish'" in unknown.error.message
    assert "receive, detect_format" in unknown.error.message
    assert Task.objects.count() == 1 and TaskArtifact.objects.exclude(task=original).count() == 0


def test_another_tenants_agent_cannot_fork_a_task(caller, fast, other_tenant):
    original = finished_task(caller)
    stranger = call_tool(get_tool("fork_task"), type(caller)(tenant_id=other_tenant.pk, actor="agent:globex/x"),
                         {"task_id": str(original.pk), "from_step": "chunk", "idempotency_key": "theirs"})

    assert stranger.error.error_class == "not_found" and Task.objects.count() == 1


def fork_form_key(client, task) -> str:
    form = client.get(reverse("admin:tools_app_task_act", args=[task.pk, "fork"]))
    assert form.status_code == 200
    return re.search(r'name="form_key" value="([0-9a-f]{32})"', form.content.decode()).group(1)


def test_an_operator_forks_a_task_from_the_admin_once_even_if_the_form_is_sent_twice(client, caller, fast,
                                                                                     tenant):
    original = finished_task(caller)
    client.force_login(make_operator("olga", OPERATOR, tenant))
    key = fork_form_key(client, original)
    form = {"reason": "summaries were cut short", "from_step": "summarize", "form_key": key}

    first = client.post(reverse("admin:tools_app_task_act", args=[original.pk, "fork"]), form, follow=True)
    client.post(reverse("admin:tools_app_task_act", args=[original.pk, "fork"]), form)

    fork = Task.objects.get(forked_from=original)
    assert f"forked as task {fork.pk}" in first.content.decode()
    assert (fork.forked_at_step, fork.actor, fork.record.tool) == ("summarize", "user:olga", "fork_task")
    assert AuditEvent.objects.get(object_id=str(fork.pk), action="task.forked").actor == "user:olga"
    assert task_jobs.run_task(str(fork.pk)) == "succeeded" and steps_run(fork) == ["summarize"]
    page = client.get(reverse("admin:tools_app_task_change", args=[original.pk]))
    assert f"{fork.pk} from summarize" in page.content.decode()


def test_an_auditor_cannot_fork_and_the_crafted_attempt_is_audited(client, caller, fast, tenant):
    original = finished_task(caller)
    client.force_login(make_operator("ann", AUDITOR, tenant))

    crafted = client.post(reverse("admin:tools_app_task_act", args=[original.pk, "fork"]),
                          {"reason": "x", "from_step": "chunk", "form_key": "a" * 32})

    assert crafted.status_code == 403 and Task.objects.count() == 1
    assert AuditEvent.objects.get(object_id=str(original.pk), action="task.fork_refused").actor == "user:ann"


def test_an_operator_of_another_tenant_cannot_fork_its_tasks(client, caller, fast, other_tenant):
    original = finished_task(caller)
    client.force_login(make_operator("gus", OPERATOR, other_tenant))

    crafted = client.post(reverse("admin:tools_app_task_act", args=[original.pk, "fork"]),
                          {"reason": "x", "from_step": "chunk", "form_key": "b" * 32})

    assert crafted.status_code == 403 and Task.objects.count() == 1
