"""The sweep's lost-job detection on a host whose clock is an hour ahead (libfaketime): it judges a job's
lock in django-q2's queue by the database's clock (tools_app.core.clock), so it still finds the job a dead
cluster held, and still leaves alone the jobs that wait their turn or that a live cluster just took. Were it
the host's clock, every job would look as if it were waiting, and a lost one would never be queued again.

`manage.py sweep_tasks` runs as its own process on the skewed clock; no job cluster runs here, so the
queue holds exactly the jobs the test arranged."""

from datetime import timedelta

import pytest
from django_q.conf import Conf
from django_q.models import OrmQ

from tests.support.processes import faketime_env, manage
from tests.support.tasks_support import TEXT, start
from tools_app.core import clock
from tools_app.models import AuditEvent, Task
from tools_app.tasks.state import lost_job_after

pytestmark = pytest.mark.live


def job_of(task: Task) -> OrmQ:
    [job] = [job for job in OrmQ.objects.all() if job.name() == f"task-{task.pk}"]
    return job


def taken(job: OrmQ, seconds_ago: float) -> None:
    """Lock `job` as the ORM broker does when a cluster takes it (until then + django-q2's retry)."""
    OrmQ.objects.filter(pk=job.pk).update(lock=clock.read() + timedelta(seconds=Conf.RETRY - seconds_ago))


def test_a_sweep_an_hour_ahead_requeues_the_job_a_dead_cluster_held_and_no_other(transactional_db, caller):
    # given three tasks queued long enough ago to be suspected (by the database's clock): one whose job
    # waits its turn, one whose job a cluster took a second ago, one whose job a cluster took as long ago
    # and then died holding
    suspected = lost_job_after() + 10
    waiting, just_taken, orphaned = (start(caller, {"text": TEXT}, key=key) for key in ("waiting", "just", "dead"))
    Task.objects.filter(pk__in=[waiting.pk, just_taken.pk, orphaned.pk]).update(
        enqueued_at=clock.read() - timedelta(seconds=suspected))
    taken(job_of(just_taken), seconds_ago=1)
    taken(job_of(orphaned), seconds_ago=suspected)
    jobs = OrmQ.objects.count()

    # when the sweep runs on a host whose clock is an hour ahead
    swept = manage("sweep_tasks", env=faketime_env("+1h"))

    # then only the orphaned task is queued again, as a lost job
    assert "expired leases: 0, requeued: 1" in swept.stdout, swept.stdout
    assert OrmQ.objects.count() == jobs + 1
    requeued = AuditEvent.objects.get(action="task.requeued")
    assert (requeued.object_id, requeued.after["job_lost"]) == (str(orphaned.pk), True)
