"""Resuming, pausing and cancelling tasks, and the sweep that revives them, in-process against real PostgreSQL."""

from datetime import timedelta

import pytest
from django.utils import timezone
from django_q.conf import Conf
from django_q.models import OrmQ

from idemops_demo.tools.documents import INGEST
from tests.support.operators import make_operator
from tests.support.tasks_support import TEXT, agent, queued_jobs, start
from tools_app import tasks
from tools_app.access import Agent
from tools_app.access.roles import OPERATOR
from tools_app.core.errors import AlreadyDone, InvalidInput, NotFound, PermissionDenied
from tools_app.models import AuditEvent, Task, TaskStatus

# --- resume, pause, the sweep ------------------------------------------------------------------


def paused_task(caller) -> Task:
    task = start(caller, {"text": TEXT})
    task = tasks.take(str(task.pk), "worker-a")
    tasks.begin_step(task, "worker-a", INGEST.steps[2], 2, completed=[])
    assert tasks.pause_for_input(task, "worker-a", "needs text", {"text": {"schema": {"type": "string"}}})
    return Task.objects.get(pk=task.pk)


def test_resume_answers_a_paused_task_only_with_what_it_asked_for(caller, fast):
    task = paused_task(caller)

    with pytest.raises(InvalidInput, match="did not ask for password"):
        tasks.resume(task, agent(caller), answer={"password": "x"})
    with pytest.raises(InvalidInput, match="does not match"):
        tasks.resume(task, agent(caller), answer={"text": 42})
    with pytest.raises(InvalidInput, match="cannot be stored at text"):  # as tasks/update may send it
        tasks.resume(task, agent(caller), answer={"text": "a\x00b"})
    resumed = tasks.resume(task, agent(caller), answer={"text": "hello"})

    assert (resumed.status, resumed.resume_input, resumed.pause_reason) == (TaskStatus.CREATED, {"text": "hello"}, "")


@pytest.mark.parametrize(("status", "failure_class", "error"), [
    (TaskStatus.SUCCEEDED, "", AlreadyDone),
    (TaskStatus.CANCELLED, "", AlreadyDone),
    (TaskStatus.FAILED, "invalid_input", InvalidInput),
    (TaskStatus.FAILED, "not_found", NotFound),
])
def test_resume_refuses_finished_tasks_another_run_would_not_change(caller, fast, status, failure_class, error):
    task = start(caller, {"text": TEXT})
    Task.objects.filter(pk=task.pk).update(status=status, failure_class=failure_class,
                                           failure_reason="the PDF is broken")
    task.refresh_from_db()

    with pytest.raises(error) as refused:
        tasks.resume(task, agent(caller))

    assert refused.value.details["task_status"] == status
    if status == TaskStatus.FAILED:
        assert "the PDF is broken" in refused.value.message


def test_resume_makes_a_backing_off_task_due_now(caller, fast):
    task = start(caller, {"text": TEXT})
    Task.objects.filter(pk=task.pk).update(status=TaskStatus.RETRYING,
                                           next_retry_at=timezone.now() + timedelta(hours=1))
    task.refresh_from_db()

    resumed = tasks.resume(task, agent(caller))

    assert resumed.next_retry_at <= timezone.now() and tasks.take(str(task.pk), "w") is not None


def test_resume_leaves_a_healthy_running_task_alone_and_revives_one_whose_worker_died(caller, fast):
    task = tasks.take(str(start(caller, {"text": TEXT}).pk), "worker-a")
    version = task.version

    assert tasks.resume(task, agent(caller)).version == version  # lease alive: nothing to do

    Task.objects.filter(pk=task.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    task.refresh_from_db()
    revived = tasks.resume(task, agent(caller))
    assert (revived.status, revived.lease_owner, revived.lease_expiries) == (TaskStatus.CREATED, "", 1)


def test_an_operator_pauses_a_queued_task_at_once_and_a_finished_one_not_at_all(caller, fast, tenant):
    task = start(caller, {"text": TEXT})
    ops = make_operator("ops", OPERATOR, tenant)

    paused = tasks.pause(task, ops, reason="waiting for the legal team")

    assert paused.status == TaskStatus.PAUSED and tasks.take(str(task.pk), "w") is None
    assert paused.pause_reason == "waiting for the legal team" and paused.pause_requested == ""
    resumed = tasks.resume(paused, ops)
    Task.objects.filter(pk=task.pk).update(status=TaskStatus.SUCCEEDED)
    resumed.refresh_from_db()
    with pytest.raises(InvalidInput, match="only queued, retrying or running"):
        tasks.pause(resumed, ops, reason="x")
    with pytest.raises(InvalidInput, match="reason"):
        tasks.pause(start(caller, {"text": TEXT}, key="k-2"), ops, reason=" ")


def test_an_agent_may_cancel_pause_and_resume_its_tenants_tasks_but_not_another_tenants(caller, fast,
                                                                                     other_tenant):
    task = start(caller, {"text": TEXT})
    stranger = Agent(other_tenant.pk, "agent:globex/test")

    with pytest.raises(PermissionDenied, match="another tenant"):
        tasks.pause(task, stranger, reason="hold on")

    task.refresh_from_db()
    assert task.status == TaskStatus.CREATED
    refusal = AuditEvent.objects.get(object_id=str(task.pk), action="task.pause_refused")
    assert (refusal.actor, refusal.after) == (stranger.actor, {"attempted": "pause"})
    assert tasks.pause(task, agent(caller), reason="hold on").status == TaskStatus.PAUSED
    assert tasks.resume(task, agent(caller)).status == TaskStatus.CREATED
    assert tasks.cancel(task, agent(caller)).status == TaskStatus.CANCELLED


def test_the_sweep_revives_dead_workers_tasks_and_requeues_lost_jobs(caller, fast):
    now = timezone.now()
    dead = tasks.take(str(start(caller, {"text": TEXT}, key="dead").pk), "worker-dead")
    Task.objects.filter(pk=dead.pk).update(lease_expires_at=now - timedelta(seconds=1))
    alive = tasks.take(str(start(caller, {"text": TEXT}, key="alive").pk), "worker-alive")
    lost = start(caller, {"text": TEXT}, key="lost")
    Task.objects.filter(pk=lost.pk).update(enqueued_at=now - timedelta(hours=1))
    job_of(lost).delete()  # its job failed without taking it (acknowledged, so gone from the queue)
    due = start(caller, {"text": TEXT}, key="due")
    Task.objects.filter(pk=due.pk).update(status=TaskStatus.RETRYING, next_retry_at=now, enqueued_at=None)
    later = start(caller, {"text": TEXT}, key="later")
    Task.objects.filter(pk=later.pk).update(status=TaskStatus.RETRYING, next_retry_at=now + timedelta(hours=1),
                                            enqueued_at=None)
    jobs = queued_jobs()

    counts = tasks.sweep()

    assert counts == {"past_deadline": 0, "expired": 1, "requeued": 2, "woken": 0}
    assert queued_jobs() == jobs + 3
    assert Task.objects.get(pk=dead.pk).status == TaskStatus.CREATED
    assert Task.objects.get(pk=alive.pk).lease_owner == "worker-alive"
    assert tasks.sweep() == {"past_deadline": 0, "expired": 0, "requeued": 0, "woken": 0}


def job_of(task: Task) -> OrmQ:
    [job] = [job for job in OrmQ.objects.all() if job.name() == f"task-{task.pk}"]
    return job


def taken(job: OrmQ, seconds_ago: float) -> None:
    """Lock `job` as the ORM broker does when a cluster takes it (until then + django-q2's retry)."""
    OrmQ.objects.filter(pk=job.pk).update(lock=timezone.now() + timedelta(seconds=Conf.RETRY - seconds_ago))


def test_a_queued_task_whose_cluster_died_holding_its_job_is_queued_again_after_its_lease_and_grace(caller, fast):
    # given tasks queued 20 s ago (lease 10 s + grace 5 s): one whose job waits its turn in a long
    # queue, one whose job a cluster took 1 s ago, one whose job a cluster took 20 s ago and died with
    waiting, just_taken, orphaned = (start(caller, {"text": TEXT}, key=key) for key in ("waiting", "just", "dead"))
    Task.objects.filter(pk__in=[waiting.pk, just_taken.pk, orphaned.pk]).update(
        enqueued_at=timezone.now() - timedelta(seconds=20))
    taken(job_of(just_taken), seconds_ago=1)
    taken(job_of(orphaned), seconds_ago=20)
    jobs = queued_jobs()

    # when the sweep runs
    counts = tasks.sweep()

    # then only the orphaned task is queued again (its old job stays locked: at most a second delivery,
    # which the task's lease turns away), and it is counted and audited as a lost job
    assert counts == {"past_deadline": 0, "expired": 0, "requeued": 1, "woken": 0}
    assert queued_jobs() == jobs + 1
    requeued = AuditEvent.objects.get(action="task.requeued")
    assert (requeued.object_id, requeued.after["job_lost"]) == (str(orphaned.pk), True)
    # its new job waits in the queue
    assert tasks.sweep() == {"past_deadline": 0, "expired": 0, "requeued": 0, "woken": 0}


def test_a_queued_task_is_not_taken_for_lost_before_its_lease_and_grace(caller, fast):
    task = start(caller, {"text": TEXT})
    Task.objects.filter(pk=task.pk).update(enqueued_at=timezone.now() - timedelta(seconds=12))
    job_of(task).delete()

    assert tasks.sweep() == {"past_deadline": 0, "expired": 0, "requeued": 0, "woken": 0}

    Task.objects.filter(pk=task.pk).update(enqueued_at=timezone.now() - timedelta(seconds=16))
    assert tasks.sweep() == {"past_deadline": 0, "expired": 0, "requeued": 1, "woken": 0}


def test_a_task_whose_workers_keep_dying_fails_as_transient(caller, fast):
    task = tasks.take(str(start(caller, {"text": TEXT}).pk), "worker-a")
    Task.objects.filter(pk=task.pk).update(lease_expiries=4, lease_expires_at=timezone.now() - timedelta(seconds=1))

    assert tasks.sweep() == {"past_deadline": 0, "expired": 1, "requeued": 0, "woken": 0}

    task.refresh_from_db()
    assert (task.status, task.failure_class, task.lease_expiries) == (TaskStatus.FAILED, "transient", 5)
    assert "died 5 times" in task.failure_reason
