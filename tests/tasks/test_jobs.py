"""The django-q2 jobs: every path in the one table resolves, schedules use it, and old paths still work."""

import pydoc

import pytest
from django.utils.module_loading import import_string
from django_q.models import Schedule

from tools_app import approvals, outbox, reconciliation, tasks
from tools_app.core import jobs
from tools_app.schedules import LOOP_JOBS, PERIODIC_JOBS


@pytest.mark.parametrize("name", sorted(jobs.JOBS))
def test_every_job_path_names_a_function_in_a_jobs_module(name):
    func = import_string(jobs.JOBS[name])

    assert callable(func)
    assert func.__module__.endswith(".jobs")


def test_every_periodic_job_and_loop_is_a_job_of_the_table():
    assert {job.job for job in PERIODIC_JOBS} | {job.job for job in LOOP_JOBS} <= set(jobs.JOBS)


@pytest.mark.django_db
def test_the_schedules_saved_after_migrate_hold_the_tables_paths():
    saved = dict(Schedule.objects.values_list("name", "func"))

    assert {job.name: jobs.JOBS[job.job] for job in PERIODIC_JOBS}.items() <= saved.items()


@pytest.mark.parametrize("old_path, job", [
    ("tools_app.approvals.run_approved", approvals.run_approved),
    ("tools_app.approvals.sweep", approvals.sweep),
    ("tools_app.outbox.relay_pending", outbox.relay_pending),
    ("tools_app.reconciliation.reconcile_due", reconciliation.reconcile_due),
    ("tools_app.reconciliation.run_periodic", reconciliation.run_periodic),
    ("tools_app.tasks.sweep", tasks.sweep),
    ("tools_app.task_runner.run_task", tasks.run_task),
    ("tools_app.audit.seal_periodically", jobs.seal_audit_chain),
])
def test_a_path_that_a_job_queued_before_the_packages_moved_still_resolves(old_path, job):
    # django-q2's worker resolves a job's path with pydoc.locate
    assert pydoc.locate(old_path) is job
