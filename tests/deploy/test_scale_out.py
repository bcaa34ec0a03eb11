"""Scaling out: two web processes and two job clusters on one PostgreSQL, driven together.

Web A runs on the host's clock; web B on a clock an hour ahead (libfaketime, as a host whose
clock went wrong would be). Both serve /mcp and the admin; two `manage.py qcluster` processes
run the jobs. Every scenario ends the same way: one side effect, every caller told the truth,
whichever process each call reached. Leases, deadlines and due times are the database's
(tools_app.core.clock): were any of them taken from a host's clock, web B would take web A's
live executions for dead, and its deadlines would run an hour late.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections import Counter
from contextlib import ExitStack
from datetime import timedelta
from decimal import Decimal
from email.utils import parsedate_to_datetime

import httpx2
import pytest
from django.db import connection
from django.urls import reverse
from django_q.models import OrmQ

from idemops_demo.models import Announcement
from tests.support.approvals_support import STAFF_NOTE, pending_request
from tests.support.approvals_support import call as call_approval
from tests.support.documents_fixtures import long_text, pdf_of_text
from tests.support.issued_ids import labelled_arguments
from tests.support.mcp_client import call, call_sync, error_of
from tests.support.operators import admin_session, login_for_the_web_server, make_operator
from tests.support.processes import WebServer, Worker, downstream_env, faketime_env, manage, running
from tests.support.task_stack import wait_until
from tools_app.access.roles import APPROVER
from tools_app.models import (
    ApprovalRequest,
    ApprovalSettings,
    ApprovalStatus,
    AuditEvent,
    IdempotencyRecord,
    StepRun,
    Task,
    TaskStatus,
    Tenant,
)
from tools_app.retention import kept_for
from tools_app.toolkit.calls import call_tool
from tools_app.toolkit.registry import get_tool

pytestmark = pytest.mark.live

AHEAD = "+1h"
ENV = {
    "IDEMOPS_TASK_LEASE_SECONDS": "2",
    "IDEMOPS_TASK_HEARTBEAT_SECONDS": "0.3",
    "IDEMOPS_TASK_BACKOFF_BASE_SECONDS": "0.4",
    "IDEMOPS_TASK_CALL_WAIT_SECONDS": "0",
    "IDEMOPS_Q_WORKERS": "2",
    "IDEMOPS_PAYMENT_GATEWAY_TIMEOUT_SECONDS": "10",
    "IDEMOPS_FOLLOWER_WAIT_SECONDS": "10",
}


@pytest.fixture(scope="module")
def farm(django_db_setup, django_db_blocker, doc_dir, _gateway, _sink):
    """web A, web B (clock an hour ahead), cluster A, cluster B: all on the test database."""
    env = {**downstream_env(_gateway, _sink), **ENV, "IDEMOPS_DOCUMENT_ALLOWED_DIRS": str(doc_dir)}
    with ExitStack() as stack:
        with django_db_blocker.unblock():
            started = stack.enter_context(running(lambda: WebServer("scale-web-a", **env),
                                                  lambda: WebServer("scale-web-b", **env, **faketime_env(AHEAD)),
                                                  lambda: Worker("scale-jobs-a", **env),
                                                  lambda: Worker("scale-jobs-b", **env)))
        yield started


@pytest.fixture
def webs(farm):
    return farm[0], farm[1]


@pytest.fixture
def clusters(farm):
    return farm[2], farm[3]


def database_now():
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement_timestamp()")
        return cursor.fetchone()[0]


def test_web_b_runs_an_hour_ahead_of_the_database_and_web_a_does_not(webs, transactional_db):
    # the premise of every other test here: an HTTP answer's Date header is its process's clock
    def clock_of(web):
        return parsedate_to_datetime(httpx2.get(f"{web.base_url}/healthz", timeout=10).headers["date"])

    web_a, web_b = webs
    assert abs(clock_of(web_a) - database_now()) < timedelta(minutes=1)
    assert clock_of(web_b) - database_now() > timedelta(minutes=59)


ORDER = {"customer": "ACME", "currency": "EUR", "items": [{"sku": "BOLT-1", "quantity": 3, "unit_price": "2.50"}]}


def payment(key: str) -> dict:
    return {"amount": "42.00", "currency": "EUR", "payee": "ACME Supplies", "idempotency_key": key}


def test_a_storm_of_identical_payments_over_both_web_processes_pays_once_and_answers_every_caller(
        webs, gateway, token):
    # given a gateway that takes two seconds to pay, so the storm arrives while the first call executes
    gateway.set_fault("*", "slow", times=1, seconds=2)
    web_a, web_b = webs

    # when forty identical calls arrive, alternately at web A and at web B (an hour ahead)
    arguments = labelled_arguments(web_a.mcp_url, token, "request_payment", payment("storm-1"))

    async def storm():
        first = asyncio.create_task(call(web_a.mcp_url, token, "request_payment", arguments))
        await asyncio.sleep(0.5)
        others = [call((web_a, web_b)[i % 2].mcp_url, token, "request_payment", arguments) for i in range(39)]
        return [await first, *await asyncio.gather(*others)]

    answers = asyncio.run(storm())

    # then one payment, and every caller was told it, none of them an error
    [(payment_id, _, _)] = gateway.payments()
    assert [a.structured_content.get("payment_id") for a in answers] == [payment_id] * 40, \
        [a.structured_content for a in answers if a.is_error]
    assert Counter(a.structured_content["idempotency"]["replayed"] for a in answers) == {False: 1, True: 39}
    record = IdempotencyRecord.objects.get(key=arguments["idempotency_key"])
    actions = Counter(AuditEvent.objects.filter(object_id=str(record.pk)).values_list("action", flat=True))
    assert (actions["record.claimed"], actions["record.succeeded"], actions["record.reclaimed"]) == (1, 1, 0)


def test_a_code_entered_on_web_a_is_fresh_for_a_step_up_approval_on_web_b_an_hour_ahead(webs, token):
    # given a payment above the tenant's step-up amount waiting for approval, and bob, who has just entered his
    # code when signing in to web A's admin
    web_a, web_b = webs
    tenant = Tenant.objects.get(slug="acme")
    ApprovalSettings.objects.create(tenant=tenant, payment_threshold=Decimal("100"), step_up_amount=Decimal("1000"),
                                    threshold_currency="EUR")
    bob = make_operator("bob", APPROVER, tenant)
    login_for_the_web_server(bob)
    arguments = labelled_arguments(web_a.mcp_url, token, "request_payment", {**payment("p-step-up"),
                                                                             "amount": "5000.00"})
    pending = error_of(call_sync(web_a.mcp_url, token, "request_payment", arguments))
    request = ApprovalRequest.objects.get(pk=pending["approval"]["request_id"])
    admin = admin_session(web_a, "bob")

    # when he approves it on web B, by whose clock that code was entered an hour ago (10 minutes are allowed)
    act = reverse("admin:tools_app_approvalqueue_act", args=[request.pk, "approve"])
    approved = admin.post(f"{web_b.base_url}{act}", data={"csrfmiddlewaretoken": admin.cookies["csrftoken"],
                                                          "reason": "checked the invoice"})

    # then the code counts as just entered (both times are the database's): approved, not asked for again
    assert approved.status_code == 302 and "stale=1" not in approved.headers["location"], approved.headers
    assert ApprovalRequest.objects.get(pk=request.pk).status == ApprovalStatus.APPROVED
    assert AuditEvent.objects.filter(action="approval.approved", object_id=str(request.pk)).count() == 1
    assert not AuditEvent.objects.filter(action="approval.refused", object_id=str(request.pk)).exists()


def follow(web: WebServer, token: str, task_id: str, rounds: int = 5):
    """get_task_result with the longest wait, again while the task is still in progress."""
    for _ in range(rounds):
        result = call_sync(web.mcp_url, token, "get_task_result", {"task_id": task_id, "wait_seconds": 60})
        if not (result.is_error and error_of(result)["class"] == "in_progress"):
            return result
    raise AssertionError(f"task {task_id} still in progress: {result.structured_content}")


@pytest.mark.usefixtures("settle_tasks")
def test_a_long_task_started_on_one_web_process_is_followed_on_the_other(webs, clusters, token):
    web_a, web_b = webs
    document = {"text": long_text(20_000), "title": "Two processes"}

    started = call_sync(web_a.mcp_url, token, "start_task",
                        {"tool": "ingest_document", "arguments": document, "idempotency_key": "task-2x2"})
    task_id = started.structured_content["task_id"]
    again = call_sync(web_b.mcp_url, token, "start_task",
                      {"tool": "ingest_document", "arguments": document, "idempotency_key": "task-2x2"})
    followed = follow(web_b, token, task_id)

    assert again.structured_content["task_id"] == task_id and Task.objects.count() == 1
    assert not followed.is_error, followed.structured_content
    task = Task.objects.get(pk=task_id)
    assert task.status == TaskStatus.SUCCEEDED
    assert followed.structured_content["result"] == task.result and task.result["chunks"] >= 1
    assert (task.attempts, task.lease_expiries) == (1, 0)  # one attempt, never handed over
    assert all(count == 1 for count in Counter(StepRun.objects.filter(task=task).values_list("step", flat=True))
               .values())


def test_an_approval_requested_on_one_web_process_approved_on_the_other_runs_once_in_a_cluster(
        webs, clusters, token):
    web_a, web_b = webs
    bob = make_operator("bob", APPROVER, Tenant.objects.get(slug="acme"))
    login_for_the_web_server(bob)
    note = labelled_arguments(web_b.mcp_url, token, "publish_announcement", {
        "title": "Maintenance", "body": "Down at 2am", "audience": "staff", "idempotency_key": "ann-2x2"})

    # the agent asks through web B (an hour ahead): the deadline is the database's time plus the TTL
    pending = error_of(call_sync(web_b.mcp_url, token, "publish_announcement", note))
    request = ApprovalRequest.objects.get(pk=pending["approval"]["request_id"])
    assert abs(request.created_at - database_now()) < timedelta(minutes=5)

    # bob approves it in web A's admin
    admin = admin_session(web_a, "bob")
    queue = "/admin/tools_app/approvalqueue/"
    page = admin.get(queue)
    csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)
    approved = admin.post(queue, data={"csrfmiddlewaretoken": csrf, "action": "approve",
                                       "_selected_action": [str(request.pk)], "index": "0", "confirm": "yes",
                                       "reason": ""})
    assert approved.status_code in (200, 302), approved.text[:500]

    # a cluster executes it; the agent's retry through web B gets the result, so does one through web A
    result = wait_until(lambda: (r := call_sync(web_b.mcp_url, token, "publish_announcement", note))
                        and not r.is_error and r, what="the approved call's result")
    via_a = call_sync(web_a.mcp_url, token, "publish_announcement", note)
    announcement = Announcement.objects.get()
    assert result.structured_content["announcement_id"] == announcement.pk
    assert via_a.structured_content["announcement_id"] == announcement.pk
    assert AuditEvent.objects.filter(action="approval.approved", object_id=str(request.pk), actor__contains="bob") \
        .count() == 1
    assert AuditEvent.objects.filter(action="record.succeeded", object_id=str(announcement.record_id)).count() == 1


@pytest.mark.usefixtures("settle_tasks")
def test_a_skewed_lease_sweep_takes_no_live_lease(webs, clusters, token, doc_dir):
    # given a task running on a cluster, its lease renewed by its heartbeat
    web_a, _ = webs
    path = doc_dir / "skew.pdf"
    path.write_bytes(pdf_of_text(long_text(600_000), title="Skew"))
    started = call_sync(web_a.mcp_url, token, "start_task", {"tool": "ingest_document",
                                                              "arguments": {"path": str(path)},
                                                              "idempotency_key": "task-skew"})
    task = Task.objects.get(pk=started.structured_content["task_id"])
    wait_until(lambda: Task.objects.get(pk=task.pk).status == TaskStatus.RUNNING, what="the task to run")

    # when the sweep runs on a host whose clock is an hour ahead (every lease would look expired by it)
    swept = manage("sweep_tasks", env=faketime_env(AHEAD))

    # then it expires nothing, and the task finishes once, never handed over
    assert "expired leases: 0" in swept.stdout, swept.stdout
    wait_until(lambda: Task.objects.get(pk=task.pk).status == TaskStatus.SUCCEEDED, timeout=240,
               what="the task to succeed")
    assert Task.objects.get(pk=task.pk).lease_expiries == 0


def test_a_cluster_killed_mid_step_leaves_its_task_to_the_other_cluster(webs, clusters, token, doc_dir):
    # given a long PDF being ingested, inside extract_text on one of the two clusters
    web_a, web_b = webs
    path = doc_dir / "handover.pdf"
    path.write_bytes(pdf_of_text(long_text(2_000_000), title="Handover"))
    started = call_sync(web_a.mcp_url, token, "start_task", {"tool": "ingest_document",
                                                              "arguments": {"path": str(path)},
                                                              "idempotency_key": "task-handover"})
    task = Task.objects.get(pk=started.structured_content["task_id"])
    run = wait_until(lambda: StepRun.objects.filter(task=task, step="extract_text", finished_at=None).first(),
                     timeout=120, what="a cluster to be inside extract_text")
    wait_until(lambda: (Task.objects.get(pk=task.pk).progress_done or 0) >= 10, timeout=120,
               what="ten pages into extract_text")

    # when that cluster (all of its processes) is SIGKILLed
    worker_pid = int(run.worker.split(":")[1])
    [doomed] = [c for c in clusters if os.getpgid(worker_pid) == c.process.pid]
    [survivor] = [c for c in clusters if c is not doomed]
    doomed.kill()

    # then the other cluster's sweep takes the task once its lease ran out, and finishes it;
    # the agent following it on web B is told the result
    followed = follow(web_b, token, str(task.pk))
    assert not followed.is_error, followed.structured_content
    task.refresh_from_db()
    assert (task.status, task.attempts, task.lease_expiries) == (TaskStatus.SUCCEEDED, 1, 1)
    runs = list(StepRun.objects.filter(task=task, step="extract_text").order_by("started_at")
                .values_list("worker", "outcome"))
    assert [outcome for _, outcome in runs] == ["running", "succeeded"]
    assert os.getpgid(int(runs[1][0].split(":")[1])) == survivor.process.pid
    assert AuditEvent.objects.filter(object_id=str(task.pk), action="task.lease_expired").count() == 1
    assert followed.structured_content["result"] == task.result
    # The job the killed cluster held stays locked in django-q2's queue until its retry time (the
    # survivor would find its task finished), and the killed step run never finishes: no
    # settle_tasks here; the stale job is removed so that no worker takes it during the flush.
    OrmQ.objects.all().delete()


# --- periodic jobs and answers on a host an hour ahead ------------------------------------------


def hold_schedule(name: str) -> None:
    """Push a periodic job's next run a day away. The module's job clusters (`farm`) run the schedules,
    and each flush of the test database re-creates them due at once: their sweep must not be the one the
    test watches."""
    from django_q.models import Schedule

    assert Schedule.objects.filter(name=name).update(next_run=database_now() + timedelta(days=1)) <= 1


def run_an_hour_ahead(code: str) -> str:
    """`code` in a Django process of its own whose clock is an hour ahead (a job cluster on that host)."""
    return manage("shell", "-c", code, env=faketime_env(AHEAD)).stdout


def test_an_escalation_sweep_an_hour_ahead_escalates_no_request_before_its_time(transactional_db, caller, tenant):
    # given a request that has waited 40 of its tenant's 60 minutes (by the database's clock)
    hold_schedule("approvals.escalate")
    request = pending_request(call_approval(caller, "publish_announcement", idempotency_key="a-skew", **STAFF_NOTE))
    ApprovalRequest.objects.filter(pk=request.pk).update(created_at=database_now() - timedelta(minutes=40))

    # when the escalation sweep runs on a host whose clock is an hour ahead (by it, 100 minutes have passed)
    escalated = run_an_hour_ahead("from tools_app import approvals; print('escalated:', approvals.escalate())")

    # then nothing is escalated; twenty-one minutes later by the database's clock, it is, once
    assert "escalated: 0" in escalated, escalated
    assert ApprovalRequest.objects.get(pk=request.pk).escalated_at is None
    ApprovalRequest.objects.filter(pk=request.pk).update(created_at=database_now() - timedelta(minutes=61))
    assert "escalated: 1" in run_an_hour_ahead("from tools_app import approvals; print('escalated:', "
                                               "approvals.escalate())")
    request.refresh_from_db()
    assert abs(request.escalated_at - database_now()) < timedelta(minutes=5)
    assert AuditEvent.objects.get(action="approval.escalated").after == {"waited_minutes": 61}


def test_a_purge_an_hour_ahead_purges_nothing_before_its_retention_ends(transactional_db, caller, tenant):
    # given an order whose retention ends in half an hour by the database's clock
    hold_schedule("retention.purge")
    assert call_tool(get_tool("create_order"), caller, {**ORDER, "idempotency_key": "o-skew"}).error is None
    retention = kept_for("records", tenant.pk, "create_order")
    now = database_now()
    IdempotencyRecord.objects.update(finished_at=now - retention + timedelta(minutes=30),
                                     expires_at=now + timedelta(minutes=30))

    # when the purge runs on a host whose clock is an hour ahead
    purged = run_an_hour_ahead("from tools_app import retention; print('purged:', retention.purge().total)")

    # then nothing is purged yet; an hour later by the database's clock, the record is
    assert "purged: 0" in purged, purged
    assert IdempotencyRecord.objects.get().purged_at is None
    IdempotencyRecord.objects.update(finished_at=now - retention - timedelta(minutes=30),
                                     expires_at=now - timedelta(minutes=30))
    assert "purged: 1" in run_an_hour_ahead("from tools_app import retention; print('purged:', "
                                            "retention.purge().total)")
    assert abs(IdempotencyRecord.objects.get().purged_at - database_now()) < timedelta(minutes=5)


def test_get_operation_on_a_web_process_an_hour_ahead_tells_the_databases_retry_after(webs, gateway, token):
    # given a payment the gateway refused for an hour (the record may run again an hour from now)
    gateway.set_fault("*", "unavailable-for-ages", times=1)
    web_a, web_b = webs
    arguments = labelled_arguments(web_a.mcp_url, token, "request_payment", payment("p-wait"))
    assert error_of(call_sync(web_a.mcp_url, token, "request_payment", arguments))["retry_after"] == 3600

    # when the agent asks get_operation through web B, whose clock is an hour ahead
    answer = call_sync(web_b.mcp_url, token, "get_operation", {"tool": "request_payment",
                                                                "idempotency_key": arguments["idempotency_key"]})

    # then it is told the wait the database's clock leaves, not none
    assert not answer.is_error, answer.structured_content
    assert 3000 < answer.structured_content["error"]["retry_after"] <= 3600, answer.structured_content
