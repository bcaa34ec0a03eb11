"""Bulk "resume" over tasks that failed for real: their document server answered 503 until attempts ran
out, or their deadline passed before a worker ran them (the worker ended them), or the document was not
there (a deterministic failure, which resume refuses). The operator's console POST selects within their
tenants only; each resumable task is resumed (status, its own audit event) and then completes when its
job runs; a refused one is counted as not done with its reason; another tenant's tasks are untouched."""

from datetime import timedelta

from django.urls import reverse

from tests.bulk.support import run_to_the_end
from tests.support.operators import make_operator
from tests.support.task_stack import DocServer
from tests.support.tasks_support import TEXT, start
from tools_app import access, bulk
from tools_app.access.roles import OPERATOR
from tools_app.conf import override_conf
from tools_app.core import clock
from tools_app.core.errors import ErrorClass
from tools_app.models import AuditEvent, Task, TaskStatus
from tools_app.tasks import jobs as task_jobs
from tools_app.toolkit.calls import Caller

NEW = reverse("admin:tools_app_bulkaction_new")


def ended_by_its_deadline(caller: Caller, key: str) -> Task:
    """A task whose deadline passed before a worker ran it: the worker ends it (failed, transient)."""
    task = start(caller, {"text": TEXT}, key=key)
    Task.objects.filter(pk=task.pk).update(deadline_at=clock.NOW - timedelta(seconds=1))
    assert task_jobs.run_task(str(task.pk)) == "failed: its deadline passed"
    return task


def fetched(task: Task) -> Task:
    return Task.objects.get(pk=task.pk)


def test_bulk_resume_resumes_each_really_failed_task_of_the_operators_tenants_which_then_completes(
        transactional_db, client, tenant, other_tenant, fast):
    # given: tasks that failed for real in acme, and in globex, whose operator alice is not
    override_conf(fast, task_max_attempts=2)
    server = DocServer()
    override_conf(fast, document_allowed_url_prefixes=[server.base_url])
    acme = Caller(tenant_id=tenant.pk, actor="agent:acme/test")
    globex = Caller(tenant_id=other_tenant.pk, actor="agent:globex/test")
    try:
        down = [start(acme, {"url": server.serve(f"down-{i}.txt", b"fine now", statuses=[503] * 2)}, key=f"d-{i}")
                for i in range(2)]
        for task in down:
            assert task_jobs.run_task(str(task.pk)) == "failed"
        late = [ended_by_its_deadline(acme, f"late-{i}") for i in range(3)]
        missing = start(acme, {"url": server.fail("missing.txt", 404)}, key="missing")
        assert task_jobs.run_task(str(missing.pk)) == "failed"
        theirs = [ended_by_its_deadline(globex, f"theirs-{i}") for i in range(2)]
        resumable = down + late
        assert {(t.status, t.failure_class) for t in map(fetched, resumable + theirs)} == {
            (TaskStatus.FAILED, ErrorClass.TRANSIENT)}
        assert fetched(missing).status == TaskStatus.FAILED and fetched(missing).failure_class != ErrorClass.TRANSIENT

        alice = make_operator("alice", OPERATOR, tenant)
        client.force_login(alice)
        tasks_filter = {"target": "tasks", "count": "1"}

        # when: she counts the failed tasks, tries to name globex's, then confirms "resume"
        counted = client.post(NEW, tasks_filter).content.decode()
        crafted = client.post(NEW, {"target": "tasks", "tenant": "globex", "confirm": "1", "action": "resume"})
        assert bulk.BulkAction.objects.count() == 0  # globex is not a tenant she may choose: nothing started
        confirmed = client.post(NEW, {"target": "tasks", "confirm": "1", "action": "resume", "reason": "index is up"})
        action = bulk.BulkAction.objects.get()
        run_to_the_end(action.pk)
        action.refresh_from_db()

        # then: the count and the frozen selection hold her tenant's six failed tasks, none of globex's
        assert "<strong>6</strong> matches" in counted
        assert crafted.status_code == 200 and "Select a valid choice" in crafted.content.decode()
        assert bulk.count(bulk.Filter(target=bulk.Target.TASKS, tenant="globex"), alice) == 0
        assert confirmed.status_code == 302 and action.total == 6
        assert set(bulk.BulkItem.objects.filter(bulk=action).values_list("object_id", flat=True)) == {
            str(t.pk) for t in resumable + [missing]}
        # and: each transient failure was resumed by her, audited once each; the not-found one refused, with why
        assert (action.state, action.done, action.failed) == ("done", 5, 1)
        assert all(fetched(t).status == TaskStatus.CREATED for t in resumable)
        resumed = AuditEvent.objects.filter(action="task.resumed", actor="user:alice")
        assert sorted(resumed.values_list("object_id", flat=True)) == sorted(str(t.pk) for t in resumable)
        assert fetched(missing).status == TaskStatus.FAILED
        failures = bulk.progress(action)["failures"]
        assert [object_id for object_id, _ in failures] == [str(missing.pk)] and "new task" in failures[0][1]
        # and: globex's tasks were left as they were, with no resume attempted on them
        assert all(fetched(t).status == TaskStatus.FAILED for t in theirs)
        assert not AuditEvent.objects.filter(object_id__in=[str(t.pk) for t in theirs],
                                             action__startswith="task.resume").exists()
        assert not access.scope(Task.objects.filter(pk__in=[t.pk for t in theirs]), alice).exists()

        # and: each resumed task completes when its job runs (the document server answers now)
        assert [task_jobs.run_task(str(t.pk)) for t in resumable] == ["succeeded"] * 5
        assert {fetched(t).status for t in resumable} == {TaskStatus.SUCCEEDED}
    finally:
        server.close()
