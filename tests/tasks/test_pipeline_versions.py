"""A deploy never changes a running task silently (issue 42, point 1).

Real `manage.py qcluster` processes running other code (tests/tasks/deployed_pipelines.py, chosen by
DEPLOYED_PIPELINE): tasks start on the first deploy (v1) and stop halfway (a step waits for a
go-ahead); the second deploy (v2) changed the steps but keeps v1 runnable, so the resumed task finishes
on v1's steps while a new task runs v2's; the third (v3) dropped v1, so its worker, its web process and
`manage.py check` refuse to start, naming the v1 task still unfinished.
"""

import subprocess
import sys

import pytest

from tests.support.processes import ROOT, WebServer, Worker, child_env
from tests.support.task_stack import wait_until
from tools_app import access, tasks
from tools_app.access.authorization import Agent
from tools_app.models import StepRun, Task, TaskStatus
from tools_app.toolkit import registry
from tools_app.toolkit.calls import Caller, call_tool
from tools_app.toolkit.registry import get_tool

pytestmark = pytest.mark.live

MODULE = "tests.tasks.deployed_pipelines"


def deployed(deploy: str, **env: str) -> dict[str, str]:
    return {"IDEMOPS_TOOL_MODULES": MODULE, "DEPLOYED_PIPELINE": deploy, "IDEMOPS_Q_WORKERS": "1", **env}


@pytest.fixture
def deploy_here(monkeypatch):
    """Declare a deploy of ledger_sync in this process too (its calls start the tasks), in a registry
    restored at the end."""
    from tests.tasks import deployed_pipelines

    monkeypatch.setattr(registry, "_TOOLS", dict(registry._TOOLS))

    def declare(deploy: str) -> None:
        registry._TOOLS.pop("ledger_sync", None)
        deployed_pipelines.declare(deploy)
    return declare


def start(caller, key: str) -> Task:
    result = call_tool(get_tool("start_task"), caller,
                       {"tool": "ledger_sync", "arguments": {"account": key}, "idempotency_key": key})
    assert result.error is None, result.error
    return Task.objects.get(pk=result.result["task_id"])


def refreshed(task: Task) -> Task:
    task.refresh_from_db()
    return task


def test_a_task_finishes_on_the_version_it_started_with_and_a_deploy_that_cannot_run_it_refuses_naming_it(
        transactional_db, deploy_here):
    tenant = access.create_tenant("acme", "ACME")
    caller = Caller(tenant_id=tenant.pk, actor="agent:acme/test")

    # given two tasks started on deploy v1, both stopped halfway (at step "hold", waiting for a go-ahead)
    deploy_here("v1")
    first_worker = Worker(name="deploy-v1", **deployed("v1"))
    try:
        resumed, left = start(caller, "acct-1"), start(caller, "acct-2")
        for task in (resumed, left):
            wait_until(lambda task=task: refreshed(task).status == TaskStatus.PAUSED, timeout=60,
                       what="the v1 task to stop at its hold step")
    finally:
        first_worker.stop(grace=3)
    assert (resumed.pipeline_version, left.pipeline_version) == (1, 1)

    # when deploy v2 (other steps, v1 kept runnable) runs, and the first task is told to go on
    deploy_here("v2")
    second_worker = Worker(name="deploy-v2", **deployed("v2"))
    try:
        tasks.resume(resumed, Agent(tenant.pk, caller.actor), answer={"go": True})
        wait_until(lambda: refreshed(resumed).status == TaskStatus.SUCCEEDED, timeout=60,
                   what="the v1 task to finish on deploy v2")
        new = start(caller, "acct-3")
        wait_until(lambda: refreshed(new).status == TaskStatus.SUCCEEDED, timeout=60, what="a v2 task to finish")
    finally:
        second_worker.stop(grace=3)

    # then the old task finished on v1's steps (v2's new step "check" never ran for it), the new one on v2's
    assert resumed.result == {"made_by": ["v1:reserve", "v1:hold", "v1:finish"]}
    assert list(StepRun.objects.filter(task=resumed, outcome="succeeded").values_list("step", flat=True)) == [
        "reserve", "hold", "finish"]
    assert (new.pipeline_version, new.result) == (2, {"made_by": ["v2:reserve", "v2:check", "v2:hold",
                                                                  "v2:finish"]})

    # and deploy v3, which dropped v1, refuses to start while the v1 task is unfinished, naming it:
    # its worker, its web process, and `manage.py check`
    assert refreshed(left).status == TaskStatus.PAUSED
    with pytest.raises(RuntimeError) as refused:
        Worker(name="deploy-v3", **deployed("v3"))
    assert str(left.pk) in str(refused.value) and "pipeline version 1" in str(refused.value)
    with pytest.raises(RuntimeError) as refused_web:
        WebServer(name="deploy-v3-web", **deployed("v3"))
    assert str(left.pk) in str(refused_web.value)
    checked = subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, env=child_env(**deployed("v3")),
                             capture_output=True, text=True, timeout=120)
    assert checked.returncode != 0
    assert "idemops.E042" in checked.stderr and str(left.pk) in checked.stderr
    assert str(resumed.pk) not in checked.stderr  # a finished task strands nothing

    # once that task is cancelled, deploy v3 starts
    tasks.cancel(left, Agent(tenant.pk, caller.actor), reason="v1 retired")
    subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, env=child_env(**deployed("v3")),
                   capture_output=True, text=True, timeout=120, check=True)
