"""The task state machine, the runner and checkpoints, in-process against real PostgreSQL.

Jobs are run by calling the django-q2 job function (task_jobs.run_task)
in the test process; the live tests run them on real clusters.
"""

import random

import pytest
from django.db import transaction
from django.urls import reverse

from idemops_demo.tools.documents import INGEST
from tests.support.operators import make_operator
from tests.support.race import race
from tests.support.task_stack import DocServer
from tests.support.tasks_support import TEXT, agent, queued_jobs, start
from tools_app import tasks
from tools_app.access.roles import AUDITOR, OPERATOR
from tools_app.conf import override_conf
from tools_app.core.errors import NotFound, Transient
from tools_app.core.jobs import JOBS
from tools_app.models import AuditEvent, Checkpoint, StepOutcome, StepRun, Task, TaskArtifact, TaskStatus
from tools_app.tasks import checkpoints
from tools_app.tasks import jobs as task_jobs
from tools_app.tasks.agent_view import overall_progress
from tools_app.toolkit.calls import call_tool
from tools_app.toolkit.pipelines import Pipeline, RetryPolicy, Step
from tools_app.toolkit.registry import get_tool

# --- starting ----------------------------------------------------------------------------------


def test_start_task_creates_one_task_queued_in_the_same_transaction(caller, fast):
    task = start(caller, {"text": TEXT})
    again = call_tool(get_tool("start_task"), caller,
                      {"tool": "ingest_document", "arguments": {"text": TEXT}, "idempotency_key": "k-1"})

    assert again.replayed and again.result["task_id"] == str(task.pk)
    assert (task.status, task.steps_total, task.max_attempts, task.attempts) == (TaskStatus.CREATED, 7, 5, 1)
    assert task.arguments["text"] == TEXT and "idempotency_key" not in task.arguments
    assert queued_jobs() == 1
    assert list(AuditEvent.objects.filter(object_id=str(task.pk)).values_list("action", flat=True)) == [
        "task.created"]


def test_a_start_whose_transaction_rolls_back_leaves_no_task_and_no_queued_job(caller, fast):
    with pytest.raises(RuntimeError), transaction.atomic():
        start(caller, {"text": TEXT})
        assert Task.objects.count() == 1 and queued_jobs() == 1
        raise RuntimeError("the surrounding transaction fails")

    assert not Task.objects.exists() and queued_jobs() == 0


@pytest.mark.parametrize(("arguments", "message"), [
    ({"tool": "create_order", "arguments": {}}, "does not run as a task"),
    ({"tool": "ingest_document", "arguments": {"text": "x", "idempotency_key": "other"}}, "to start_task itself"),
    ({"tool": "ingest_document", "arguments": {"text": "x", "url": "http://a/"}}, "exactly one of"),
    ({"tool": "ingest_document", "arguments": {"text": "x", "colour": "red"}}, "colour"),
    ({"tool": "ingest_document", "arguments": {"path": "/etc/passwd"}}, "not under a directory"),
    ({"tool": "ingest_document", "arguments": {"url": "http://169.254.169.254/latest/"}}, "allow-list"),
    ({"tool": "ingest_document", "arguments": {"content_base64": "%%%"}}, "not valid base64"),
])
def test_start_task_refuses_bad_calls_before_any_task_exists(caller, fast, arguments, message):
    result = call_tool(get_tool("start_task"), caller, {**arguments, "idempotency_key": "bad"})

    assert result.error.error_class == "invalid_input" and message in result.error.message
    assert not Task.objects.exists() and queued_jobs() == 0


def test_start_task_of_an_unknown_tool_is_not_found(caller):
    result = call_tool(get_tool("start_task"), caller, {"tool": "nope", "arguments": {}, "idempotency_key": "n"})

    assert result.error.error_class == "not_found" and not Task.objects.exists()


def test_calling_the_long_tool_itself_is_start_task_and_answers_in_progress_with_the_task(caller, fast):
    result = call_tool(get_tool("ingest_document"), caller, {"text": TEXT, "idempotency_key": "direct"})
    via_start = call_tool(get_tool("start_task"), caller,
                          {"tool": "ingest_document", "arguments": {"text": TEXT}, "idempotency_key": "direct"})

    task = Task.objects.get()
    assert result.error.error_class == "in_progress" and result.error.details["task_id"] == str(task.pk)
    assert via_start.replayed and via_start.result["task_id"] == str(task.pk)


# --- running -----------------------------------------------------------------------------------


def test_a_task_runs_every_step_once_and_checkpoints_each(transactional_db, caller, fast):
    task = start(caller, {"text": TEXT})

    outcome = task_jobs.run_task(str(task.pk))

    task.refresh_from_db()
    assert outcome == "succeeded" and task.status == TaskStatus.SUCCEEDED
    assert task.completed_steps == [step.name for step in INGEST.steps]
    assert list(StepRun.objects.filter(task=task).values_list("step", "outcome")) == [
        (step.name, StepOutcome.SUCCEEDED) for step in INGEST.steps]
    assert Checkpoint.objects.filter(task=task).count() == 7
    assert task.result["title"] == "Notes" and task.result["format"] == "markdown"
    assert (task.lease_owner, task.lease_expires_at, task.current_step) == ("", None, "")


def test_a_job_for_a_task_another_worker_holds_ends_without_running_anything(transactional_db, caller, fast):
    task = start(caller, {"text": TEXT})
    assert tasks.take(str(task.pk), "worker-a") is not None

    outcome = task_jobs.run_task(str(task.pk))

    assert outcome.startswith("not taken") and not StepRun.objects.exists()


def test_of_two_workers_racing_for_a_task_exactly_one_takes_it(transactional_db, caller, fast):
    task = start(caller, {"text": TEXT})
    workers = race(*[lambda name=f"worker-{n}": tasks.take(str(task.pk), name) for n in range(8)])

    assert workers.answered(8) and not workers.errors
    winners = [t for t in workers.results if t is not None]
    assert len(winners) == 1
    task.refresh_from_db()
    assert task.status == TaskStatus.RUNNING and task.lease_owner == winners[0].lease_owner


def test_a_finished_steps_own_progress_is_not_counted_again_once_it_is_completed(caller, fast):
    # given a worker half-way through the first step, by its own report
    task = start(caller, {"text": TEXT})
    mine = tasks.take(str(task.pk), "worker-a")
    run = tasks.begin_step(mine, "worker-a", INGEST.steps[0], 0, completed=[])
    assert tasks.renew_lease(task.pk, "worker-a", progress=(5, 10, "half"))

    # when the step completes and the job's slice ends there (no next step started in this job)
    prepared = checkpoints.prepare(mine, INGEST.steps[0], 0, {"data_base64": ""}, [])
    assert tasks.complete_step(mine, "worker-a", prepared, run) == tasks.Advanced(moved=True, next_run=None)

    # then a caller waiting for it sees one step done, not one and a half
    task.refresh_from_db()
    assert overall_progress(task) == 1.0


def test_a_cancel_takes_the_lease_away_so_the_running_worker_writes_nothing_more(transactional_db, caller, fast):
    task = start(caller, {"text": TEXT})
    mine = tasks.take(str(task.pk), "worker-a")
    run = tasks.begin_step(mine, "worker-a", INGEST.steps[0], 0, completed=[])

    tasks.cancel(Task.objects.get(pk=task.pk), agent(caller), reason="changed my mind")

    prepared = checkpoints.prepare(mine, INGEST.steps[0], 0, {"data_base64": ""}, [])
    assert tasks.renew_lease(task.pk, "worker-a") is False
    assert tasks.complete_step(mine, "worker-a", prepared, run) == tasks.Advanced(moved=False)
    assert tasks.begin_step(mine, "worker-a", INGEST.steps[1], 1, completed=[]) is None
    assert not Checkpoint.objects.exists()
    task.refresh_from_db()
    assert task.status == TaskStatus.CANCELLED and "changed my mind" in task.failure_reason


def test_a_transient_error_is_retried_with_backoff_until_attempts_run_out_then_resume_runs_it_again(
        transactional_db, caller, fast):
    # given a document server that is always unavailable, and three attempts allowed
    override_conf(fast, task_max_attempts=3)
    server = DocServer()
    override_conf(fast, document_allowed_url_prefixes=[server.base_url])
    url = server.serve("down.txt", b"fine now", statuses=[503] * 3)
    try:
        task = start(caller, {"url": url})

        # when its job runs (waiting out the short backoffs itself)
        outcome = task_jobs.run_task(str(task.pk))

        # then it failed as transient after three attempts, each a failed receive
        task.refresh_from_db()
        assert outcome == "failed" and server.hits["/docs/down.txt"] == 3
        assert (task.status, task.failure_class, task.attempts) == (TaskStatus.FAILED, "transient", 3)
        assert "gave up after 3 attempts" in task.failure_reason
        assert AuditEvent.objects.filter(object_id=str(task.pk), action="task.retry_scheduled").count() == 2

        # and resume_task runs it again from the start of its attempts
        tasks.resume(task, agent(caller))
        assert (task.status, task.attempts) == (TaskStatus.CREATED, 1)
        assert task_jobs.run_task(str(task.pk)) == "succeeded"
    finally:
        server.close()


def test_a_long_job_hands_the_task_on_to_a_new_job_at_a_step_boundary(transactional_db, caller, fast):
    override_conf(fast, task_slice_seconds=0)
    task = start(caller, {"text": TEXT})

    outcomes = [task_jobs.run_task(str(task.pk)) for _ in range(7)]

    assert outcomes == ["handed on to a new job"] * 6 + ["succeeded"]
    assert queued_jobs() == 7  # the first job and six continuations
    assert StepRun.objects.filter(task=task).count() == 7


# --- checkpoints -------------------------------------------------------------------------------


def test_resume_reuses_only_checkpoints_whose_checksum_and_inputs_still_match(transactional_db, caller, fast):
    task = start(caller, {"text": TEXT * 400})  # large enough for artifacts
    task_jobs.run_task(str(task.pk))
    task.refresh_from_db()
    assert checkpoints.valid_prefix(task, INGEST).next_index == 7
    assert TaskArtifact.objects.filter(task=task).exists()

    # an artifact altered in place: its step and everything after it must run again
    chunk = Checkpoint.objects.get(task=task, step="chunk")
    TaskArtifact.objects.filter(pk=chunk.artifact_id).update(data=b'{"chunks":[]}')
    assert checkpoints.valid_prefix(task, INGEST).next_index == 3

    # a step whose version changed: its old output no longer counts
    bumped = Pipeline(steps=tuple(Step(s.name, s.run, version=2 if s.name == "receive" else 1)
                                  for s in INGEST.steps))
    assert checkpoints.valid_prefix(task, bumped).next_index == 0
    assert AuditEvent.objects.filter(object_id=str(task.pk), action="task.checkpoint_rejected").count() == 2


def test_a_rewritten_checkpoint_replaces_the_invalid_one(transactional_db, caller, fast):
    task = start(caller, {"text": TEXT * 400})
    task_jobs.run_task(str(task.pk))
    Checkpoint.objects.filter(task=task, step="chunk").update(checksum="0" * 64)
    Task.objects.filter(pk=task.pk).update(status=TaskStatus.CREATED, result=None, finished_at=None)

    assert task_jobs.run_task(str(task.pk)) == "succeeded"

    assert Checkpoint.objects.filter(task=task).count() == 7
    assert TaskArtifact.objects.filter(task=task).count() == Checkpoint.objects.filter(
        task=task, artifact__isnull=False).count()
    assert StepRun.objects.filter(task=task, step="chunk").count() == 2
    assert StepRun.objects.filter(task=task, step="extract_text").count() == 1


# --- the pipeline declaration ---------------------------------------------------------------------


def test_backoff_doubles_per_attempt_with_jitter_and_a_ceiling():
    policy = RetryPolicy(base_seconds=1, max_seconds=10)
    rng = random.Random(1)

    delays = [[policy.backoff(attempt, rng) for _ in range(200)] for attempt in (1, 2, 3, 4, 5, 6)]

    for attempt, samples in zip((1, 2, 3, 4), delays, strict=False):
        cap = 2 ** (attempt - 1)
        assert cap / 2 <= min(samples) and max(samples) <= cap and len(set(samples)) > 100
    assert max(delays[4] + delays[5]) <= 10 and min(delays[5]) >= 5


def test_errors_are_classified_by_the_pipeline():
    class Broken(Exception):
        pass

    pipeline = Pipeline(steps=INGEST.steps, final=(Broken,))

    assert pipeline.classify(Broken("bad bytes")).error_class == "invalid_input"
    assert pipeline.classify(ConnectionError("reset")).error_class == "transient"
    assert pipeline.classify(KeyError("a bug"), "t-1").error_class == "internal_error"
    assert pipeline.classify(NotFound("gone")).error_class == "not_found"
    assert pipeline.classify(Transient("later", retry_after=3)).retry_after == 3


def test_a_pipeline_needs_unique_step_names():
    with pytest.raises(ValueError, match="unique names"):
        Pipeline(steps=(Step("a", print), Step("a", print)))
    assert get_tool("ingest_document").pipeline is INGEST and get_tool("create_order").pipeline is None


# --- operators ------------------------------------------------------------------------------------


def test_the_sweep_is_a_periodic_django_q2_schedule(db):
    from django_q.models import Schedule

    from tools_app.schedules import ensure_schedules

    ensure_schedules()
    ensure_schedules()

    schedule = Schedule.objects.get(name="tasks.sweep")
    assert (schedule.func, schedule.schedule_type, schedule.minutes) == (JOBS["tasks.sweep"], "I", 1)


def test_a_schedule_of_ours_under_an_old_name_is_removed_so_its_job_does_not_run_twice(db):
    from django_q.models import Schedule

    from tools_app.schedules import PERIODIC_JOBS, ensure_schedules

    Schedule.objects.create(name="idemops: task sweep", func=JOBS["tasks.sweep"], schedule_type=Schedule.MINUTES)
    Schedule.objects.create(name="an adopter's own", func="myapp.jobs.nightly", schedule_type=Schedule.DAILY)

    ensure_schedules()

    assert sorted(Schedule.objects.values_list("name", flat=True)) == sorted(
        [job.name for job in PERIODIC_JOBS] + ["an adopter's own"])


def running_task(caller) -> Task:
    task = start(caller, {"text": TEXT})
    tasks.begin_step(tasks.take(str(task.pk), "worker-a"), "worker-a", INGEST.steps[0], 0, completed=[])
    return task


def test_an_operator_reads_a_tasks_step_history_and_cancels_it_with_a_reason(client, caller, fast, tenant):
    task = running_task(caller)
    client.force_login(make_operator("olga", OPERATOR, tenant))

    listing = client.get(reverse("admin:tools_app_task_changelist"), {"status__exact": "running"})
    page = client.get(reverse("admin:tools_app_task_change", args=[task.pk]))
    client.post(reverse("admin:tools_app_task_act", args=[task.pk, "cancel"]), {"reason": "upstream is down"})

    assert listing.status_code == 200 and str(task.pk) in listing.content.decode()
    assert page.status_code == 200
    assert "worker-a" in page.content.decode() and "task.step_started" in page.content.decode()
    task.refresh_from_db()
    assert task.status == TaskStatus.CANCELLED
    event = AuditEvent.objects.get(object_id=str(task.pk), action="task.cancelled")
    assert (event.actor, event.reason) == ("user:olga", "upstream is down")


def test_an_auditor_sees_tasks_but_a_crafted_cancel_is_refused_and_audited(client, caller, fast, tenant):
    task = running_task(caller)
    client.force_login(make_operator("ann", AUDITOR, tenant))

    page = client.get(reverse("admin:tools_app_task_change", args=[task.pk]))
    crafted = client.post(reverse("admin:tools_app_task_act", args=[task.pk, "cancel"]), {"reason": "just because"})

    assert page.status_code == 200 and page.context["operator_actions"] == [] and crafted.status_code == 403
    task.refresh_from_db()
    assert task.status == TaskStatus.RUNNING
    assert AuditEvent.objects.get(object_id=str(task.pk), action="task.cancel_refused").actor == "user:ann"


def test_an_operator_does_not_see_another_tenants_tasks(client, caller, fast, other_tenant):
    task = running_task(caller)
    client.force_login(make_operator("gus", OPERATOR, other_tenant))

    listing = client.get(reverse("admin:tools_app_task_changelist"))
    act = client.post(reverse("admin:tools_app_task_act", args=[task.pk, "cancel"]), {"reason": "x"})

    assert str(task.pk) not in listing.content.decode() and act.status_code == 403
    assert Task.objects.get(pk=task.pk).status == TaskStatus.RUNNING
