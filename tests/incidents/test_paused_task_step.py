"""Issue 36 §3: a long task whose next step calls a paused downstream waits, visibly, without spending
an attempt, and goes on after the resume; the pause and the resume need the permission, and are audited."""

from django.contrib.auth import get_user_model

from idemops_demo.models import Customer
from tests.support.operators import make_operator, verified
from tools_app import incidents
from tools_app.access.roles import OPERATOR
from tools_app.core import clock, polling
from tools_app.core.errors import PermissionDenied
from tools_app.models import AuditEvent, Pause, Task, TaskStatus
from tools_app.tasks import jobs as task_jobs
from tools_app.toolkit.calls import call_tool
from tools_app.toolkit.registry import get_tool

ONBOARD = {"name": "Ada Lovelace", "email": "ada@example.com", "iban": "DE89370400440532013000"}


def run(task) -> Task:
    task_jobs.run_task(str(task.pk))
    task.refresh_from_db()
    return task


def test_a_task_step_on_a_paused_downstream_waits_without_an_attempt_and_goes_on_after_the_resume(
        transactional_db, caller, tenant, downstreams, gateway, fast):
    # given: an operator of the whole platform pauses the payment gateway; a tenant's operator may not
    olga = make_operator("olga", OPERATOR, tenant)
    try:
        incidents.pause(incidents.PauseScope.DOWNSTREAM, "payment-gateway", olga, reason="maintenance")
        raise AssertionError("a tenant's operator paused a downstream every tenant uses")
    except PermissionDenied:
        pass
    root = verified(get_user_model().objects.create_superuser("root", "root@example.invalid", "pw"))
    incidents.pause(incidents.PauseScope.DOWNSTREAM, "payment-gateway", root, reason="bank maintenance until 14:00")
    started = call_tool(get_tool("start_task"), caller, {"tool": "onboard_customer", "arguments": ONBOARD,
                                                          "idempotency_key": "on-paused"})
    assert started.error is None, started.error
    task = Task.objects.get(pk=started.result["task_id"])

    # when: a worker runs it
    task = run(task)

    # then: the customer step ran; the mandate step waits, saying why; no attempt was spent; nothing was sent
    assert task.status == TaskStatus.RETRYING and task.attempts == 1, (task.status, task.failure_reason)
    assert "paused the downstream system payment-gateway" in task.failure_reason
    assert "bank maintenance until 14:00" in task.failure_reason
    assert task.completed_steps == ["create_customer"] and gateway.mandates() == []

    # when: the operator resumes it, and the task is run again once due (a paused answer's retry_after)
    assert incidents.resume(incidents.PauseScope.DOWNSTREAM, "payment-gateway", root, reason="bank is back")
    assert polling.until(lambda: clock.read() >= task.next_retry_at, seconds=60, pause=0.2)
    task = run(task)

    # then: it went on from where it waited, with the mandate requested once
    assert "request_mandate" in task.completed_steps and task.attempts == 1, (task.status, task.failure_reason)
    assert len(gateway.mandates()) == 1 and Customer.objects.filter(task=task).count() == 1
    assert not Pause.objects.exists()
    assert list(AuditEvent.objects.filter(action__startswith="pause.").values_list("action", "actor")) == [
        ("pause.refused", "user:olga"), ("pause.started", "user:root"), ("pause.ended", "user:root")]
