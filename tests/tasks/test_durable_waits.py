"""Durable waits inside a task (issue 42, point 2).

A real `manage.py qcluster` and a real web process (uvicorn) on the test database, running the
adopter-style tool module tests/tasks/deployed_pipelines.py. A step of `await_callback` waits for the
gateway's callback (event `gateway.callback`, correlation key = the payment's ref): the task is parked,
holding no worker, and says so in its status and in the MCP task answer; it survives its worker being
SIGKILLed; the callback arrives over HTTP (POST /api/v1/task-events, the tenant's API token) twice and
counts once; an event sent before its wait began is not lost; a wait that times out, and a timer, are
woken by the cluster's sweep loop.
"""

import httpx2
import pytest

from tests.support.mcp_client import answer_of
from tests.support.operators import agent_owner
from tests.support.processes import WebServer, Worker
from tests.support.task_stack import wait_until
from tools_app import access
from tools_app.models import AuditEvent, StepRun, Task, TaskEvent, TaskStatus, TaskWait
from tools_app.toolkit import registry
from tools_app.toolkit.calls import Caller, call_tool
from tools_app.toolkit.registry import get_tool

pytestmark = pytest.mark.live

ENV = {"IDEMOPS_TOOL_MODULES": "tests.tasks.deployed_pipelines", "DEPLOYED_PIPELINE": "v1",
       "IDEMOPS_Q_WORKERS": "1", "IDEMOPS_LEASE_SWEEP_SECONDS": "0.5"}


@pytest.fixture
def declared(monkeypatch):
    from tests.tasks import deployed_pipelines

    monkeypatch.setattr(registry, "_TOOLS", dict(registry._TOOLS))
    deployed_pipelines.declare_waits()


def start(caller, ref: str, **arguments) -> Task:
    result = call_tool(get_tool("start_task"), caller, {
        "tool": "await_callback", "arguments": {"ref": ref, **arguments}, "idempotency_key": f"await-{ref}"})
    assert result.error is None, result.error
    return Task.objects.get(pk=result.result["task_id"])


def refreshed(task: Task) -> Task:
    task.refresh_from_db()
    return task


def parked(task: Task) -> bool:
    return refreshed(task).status == TaskStatus.PAUSED and task.waiting_until is not None


def test_a_step_waits_for_a_callback_parked_in_the_database_across_a_restart_and_counts_it_once(
        transactional_db, declared):
    tenant = access.create_tenant("acme", "ACME")
    _, token = access.issue_token(tenant, "gateway", owner=agent_owner("alice"))
    caller = Caller(tenant_id=tenant.pk, actor="agent:acme/test")
    web = WebServer(name="waits-web", **ENV)
    worker = Worker(name="waits-a", **ENV)
    try:
        # given a task whose step waits for the gateway's callback for pay-1
        task = start(caller, "pay-1")
        wait_until(lambda: parked(task), timeout=60, what="the task to park in its wait")

        # then it holds no worker (no lease), and its status says what it waits for, since when, until when
        assert (task.lease_owner, task.lease_expires_at) == ("", None)
        wait = TaskWait.objects.get(task=task)
        assert (wait.event, wait.key, wait.ended_at) == ("gateway.callback", "pay-1", None)
        assert task.pause_reason == (
            f"waiting for the gateway's callback (event 'gateway.callback', key 'pay-1') since "
            f"{wait.since:%Y-%m-%dT%H:%M:%SZ}, gives up at {wait.until:%Y-%m-%dT%H:%M:%SZ}")
        # and so does the MCP task answer an agent gets over HTTP (tasks/get, 2025-11-25's core method)
        got = httpx2.post(web.mcp_url, timeout=30, json={
            "jsonrpc": "2.0", "id": 2, "method": "tasks/get", "params": {"taskId": str(task.pk)}}, headers={
            "Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": "2025-11-25"})
        assert got.status_code == 200, got.text
        answer = answer_of(got)["result"]
        assert answer["status"] == "working"
        assert "waiting for the gateway's callback" in answer["statusMessage"]
        assert f"gives up at {wait.until:%Y-%m-%dT%H:%M:%SZ}" in answer["statusMessage"]

        # when its worker is SIGKILLed and another starts, the task is still parked, and nothing runs it
        worker.kill()
        worker = Worker(name="waits-b", **ENV)
        assert parked(task)
        assert StepRun.objects.filter(task=task, step="await").count() == 1

        # when the callback arrives over HTTP, twice
        unauthorized = httpx2.post(f"{web.base_url}/api/v1/task-events", timeout=30,
                                   json={"event": "gateway.callback", "key": "pay-1", "payload": {"ok": True}})
        assert unauthorized.status_code == 401
        headers = {"Authorization": f"Bearer {token}"}
        first = httpx2.post(f"{web.base_url}/api/v1/task-events", headers=headers, timeout=30,
                            json={"event": "gateway.callback", "key": "pay-1", "payload": {"status": "paid"}})
        second = httpx2.post(f"{web.base_url}/api/v1/task-events", headers=headers, timeout=30,
                             json={"event": "gateway.callback", "key": "pay-1", "payload": {"status": "refunded"}})
        assert (first.status_code, first.json()) == (202, {"received": "new"})
        assert (second.status_code, second.json()) == (200, {"received": "duplicate"})

        # then the task goes on with the first one's payload; the callback was stored once
        wait_until(lambda: refreshed(task).status == TaskStatus.SUCCEEDED, timeout=60, what="the task to finish")
        assert task.result == {"ref": "pay-1", "payload": {"status": "paid"}, "timed_out": False}
        assert TaskEvent.objects.filter(event="gateway.callback", key="pay-1").count() == 1
        assert list(StepRun.objects.filter(task=task, step="await").values_list("outcome", flat=True)) == [
            "paused", "succeeded"]
        assert AuditEvent.objects.filter(object_id=str(task.pk), action="task.woken").count() == 1

        # and an event sent before its wait began is not lost: the wait gets it at once, never parking
        from idemops.tools import send_event

        assert send_event(tenant, "gateway.callback", "pay-2", {"status": "paid early"}) is True
        early = start(caller, "pay-2")
        wait_until(lambda: refreshed(early).status == TaskStatus.SUCCEEDED, timeout=60,
                   what="the task whose event came first to finish")
        assert early.result == {"ref": "pay-2", "payload": {"status": "paid early"}, "timed_out": False}
        assert not AuditEvent.objects.filter(object_id=str(early.pk), action="task.waiting").exists()

        # and a wait that times out, after a timer, is woken by the cluster's sweep loop: the step gets None
        late = start(caller, "pay-3", timeout_seconds=2, sleep_seconds=1)
        wait_until(lambda: refreshed(late).status == TaskStatus.SUCCEEDED, timeout=60,
                   what="the task whose callback never came to give up waiting")
        assert late.result == {"ref": "pay-3", "payload": None, "timed_out": True}
        assert list(TaskWait.objects.filter(task=late).values_list("event", "outcome")) == [
            ("", "timed_out"), ("gateway.callback", "timed_out")]
        assert AuditEvent.objects.filter(object_id=str(late.pk), action="task.woken", actor="system:task-sweep"
                                         ).count() == 2
    finally:
        worker.stop(grace=3)
        web.stop(grace=3)
