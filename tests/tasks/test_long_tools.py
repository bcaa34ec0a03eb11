"""process_ticket_batch and onboard_customer, run in-process against the test database and, for the saga,
the real payment gateway and notification sink processes."""

import threading

import pytest
from django.db import connection

from idemops_demo.models import Customer, Ticket, TicketNote
from tools_app import outbox
from tools_app.conf import override_conf
from tools_app.models import StepBatch, StepRun, Task, TaskStatus
from tools_app.tasks import jobs as task_jobs
from tools_app.toolkit.calls import call_tool
from tools_app.toolkit.registry import get_tool


def start(caller, tool, arguments, key) -> Task:
    result = call_tool(get_tool("start_task"), caller, {"tool": tool, "arguments": arguments, "idempotency_key": key})
    assert result.error is None, result.error
    return Task.objects.get(pk=result.result["task_id"])


def run(task) -> Task:
    task_jobs.run_task(str(task.pk))
    task.refresh_from_db()
    return task


def tickets(tenant, count, **fields) -> list[int]:
    made = Ticket.objects.bulk_create(Ticket(tenant=tenant, subject=f"t{n}", body="b", **fields) for n in range(count))
    return [ticket.pk for ticket in made]


# --- process_ticket_batch ------------------------------------------------------------------------


def test_a_ticket_batch_reports_each_tickets_outcome_in_the_order_given(transactional_db, tenant, other_tenant,
                                                                        caller, fast):
    override_conf(fast, ticket_batch_chunk=3)
    open_ids = tickets(tenant, 4)
    closed = tickets(tenant, 1, status="closed")
    assigned = tickets(tenant, 1, assignee="ana")
    theirs = tickets(other_tenant, 1)
    ids = [*open_ids, *closed, *assigned, *theirs, 999_999]

    task = run(start(caller, "process_ticket_batch", {"ticket_ids": ids, "change": {"type": "assign",
                                                                                     "assignee": "ana"}}, "b1"))

    assert task.status == TaskStatus.SUCCEEDED, task.failure_reason
    outcomes = [(item["ticket_id"], item["outcome"], item["error_class"]) for item in task.result["items"]]
    assert outcomes == [*((pk, "changed", None) for pk in open_ids), (closed[0], "failed", "invalid_input"),
                        (assigned[0], "unchanged", None), (theirs[0], "not_found", None), (999_999, "not_found", None)]
    assert (task.result["changed"], task.result["unchanged"], task.result["not_found"], task.result["failed"]) == (
        4, 1, 2, 1)
    assert set(Ticket.objects.filter(pk__in=open_ids).values_list("assignee", flat=True)) == {"ana"}
    assert Ticket.objects.get(pk=theirs[0]).assignee == ""  # another tenant's ticket is never touched
    assert StepBatch.objects.filter(task=task).count() == 3  # 8 tickets in chunks of 3


def test_closing_adds_the_note_once_and_a_closed_ticket_is_unchanged(transactional_db, tenant, caller, fast):
    ids = tickets(tenant, 2) + tickets(tenant, 1, status="closed")

    task = run(start(caller, "process_ticket_batch", {"ticket_ids": ids, "change": {"type": "close",
                                                                                     "note": "duplicate"}}, "b2"))

    assert [item["outcome"] for item in task.result["items"]] == ["changed", "changed", "unchanged"]
    assert list(TicketNote.objects.values_list("ticket_id", "body")) == [(ids[0], "duplicate"), (ids[1], "duplicate")]


def test_a_rerun_step_skips_the_chunks_it_recorded_so_each_ticket_changes_once(transactional_db, tenant, caller,
                                                                              fast):
    # given a batch whose step ran through once (its chunks recorded), then is made to run again
    override_conf(fast, ticket_batch_chunk=2)
    ids = tickets(tenant, 5)
    task = run(start(caller, "process_ticket_batch", {"ticket_ids": ids, "change": {"type": "close",
                                                                                     "note": "n"}}, "b3"))
    first = task.result
    task.checkpoints.all().delete()  # as if the worker died after the last chunk, before the checkpoint
    Task.objects.filter(pk=task.pk).update(status=TaskStatus.CREATED, result=None, finished_at=None)

    # when it runs again
    task = run(task)

    # then every chunk's recorded outcome is reused: no ticket got a second note, the result is the same
    assert task.status == TaskStatus.SUCCEEDED and task.result == first
    assert TicketNote.objects.count() == 5
    assert StepRun.objects.filter(task=task, step="apply").count() == 2


@pytest.mark.parametrize(("arguments", "field"), [
    ({"ticket_ids": [1, 2, 1], "change": {"type": "assign", "assignee": "x"}}, "ticket_ids"),
    ({"ticket_ids": list(range(1, 10_002)), "change": {"type": "assign", "assignee": "x"}}, "ticket_ids"),
    ({"ticket_ids": [1], "change": {"type": "reopen"}}, "change"),
    ({"ticket_ids": [1], "change": {"type": "set_priority", "priority": "whenever"}}, "change.set_priority.priority"),
])
def test_a_bad_ticket_batch_is_refused_naming_the_field_before_a_task_exists(transactional_db, caller, arguments,
                                                                             field):
    result = call_tool(get_tool("start_task"), caller, {"tool": "process_ticket_batch", "arguments": arguments,
                                                        "idempotency_key": "bad"})

    assert result.error.error_class == "invalid_input" and field in result.error.message
    assert not Task.objects.exists()


# --- onboard_customer ----------------------------------------------------------------------------


ONBOARD = {"name": "Ada Lovelace", "email": "ada@example.com", "iban": "DE89370400440532013000"}


def test_a_refused_mandate_closes_the_customer_created_before_it(transactional_db, caller, downstreams, gateway,
                                                                  fast):
    # given a gateway that refuses this task's mandate (as a bank would, for good)
    task = start(caller, "onboard_customer", ONBOARD, "on-1")
    gateway.set_fault(f"{task.operation_id}.mandate", "reject")

    task = run(task)

    # then the customer step was undone and the task failed with the gateway's refusal, saying so
    assert task.status == TaskStatus.FAILED and task.failure_class == "invalid_input"
    assert "step request_mandate failed" in task.failure_reason and "undone, in this order: create_customer" in (
        task.failure_reason)
    customer = Customer.objects.get(task=task)
    assert customer.status == Customer.Status.CLOSED and customer.closed_at is not None
    assert gateway.mandates() == []
    assert [cp.step for cp in task.checkpoints.order_by("sequence")] == [
        "create_customer", "failed:request_mandate", "compensate:create_customer"]
    assert task.steps_total == 3


def test_a_fork_of_a_compensated_saga_never_reuses_a_step_that_was_undone(transactional_db, caller, downstreams,
                                                                         gateway, fast):
    # given an onboarding whose mandate was refused, so its customer was closed
    task = start(caller, "onboard_customer", ONBOARD, "on-fork")
    gateway.set_fault(f"{task.operation_id}.mandate", "reject")
    task = run(task)
    assert task.status == TaskStatus.FAILED

    def fork(from_step, key):
        return call_tool(get_tool("fork_task"), caller, {"task_id": str(task.pk), "from_step": from_step,
                                                          "idempotency_key": key})

    # when someone forks it past the closed customer, then from its first step
    refused = fork("request_mandate", "fork-1")
    allowed = fork("create_customer", "fork-2")

    # then the first is refused naming where a fork may start; the second starts afresh, reusing nothing
    assert refused.error.error_class == "invalid_input" and "fork from 'create_customer'" in refused.error.message
    assert Task.objects.filter(forked_from=task).count() == 1
    forked = Task.objects.get(pk=allowed.result["task_id"])
    assert (forked.completed_steps, forked.checkpoints.count(), forked.steps_total) == ([], 0, 3)


def test_two_onboardings_on_one_gateway_each_get_their_own_mandate(transactional_db, caller, downstreams, gateway,
                                                                   fast):
    first = run(start(caller, "onboard_customer", ONBOARD, "on-a"))
    second = run(start(caller, "onboard_customer", {**ONBOARD, "name": "Grace Hopper"}, "on-b"))

    # each got its mandate under a key of its own operation (one shared key would be refused the second time)
    assert all("request_mandate" in task.completed_steps for task in (first, second)), [
        task.failure_reason for task in (first, second)]
    keys = [key for _, key, _ in gateway.mandates()]
    assert sorted(keys) == sorted(f"{task.operation_id}.mandate" for task in (first, second))
    assert len(set(keys)) == 2


def test_an_onboarding_runs_each_service_once_and_answers_the_customer(transactional_db, caller, downstreams,
                                                                       gateway, sink, fast):
    task = start(caller, "onboard_customer", ONBOARD, "on-2")

    # the relay delivers the welcome email while the step waits for it (a worker's loop would)
    worker = threading.Thread(target=lambda: (task_jobs.run_task(str(task.pk)), connection.close()))
    worker.start()
    while worker.is_alive():
        outbox.relay_batch()
        worker.join(0.2)
    task.refresh_from_db()

    assert task.status == TaskStatus.SUCCEEDED, task.failure_reason
    customer = Customer.objects.get(task=task)
    assert task.result == {"customer_id": customer.pk, "mandate_id": customer.mandate_id,
                           "welcome_email_id": task.result["welcome_email_id"], "status": "onboarded"}
    assert [(key, status) for _, key, status in gateway.mandates()] == [
        (f"{task.operation_id}.mandate", "active")]
    assert sink.messages() == {task.result["welcome_email_id"]: 1}


def test_a_sagas_plan_after_a_failure_is_the_steps_before_it_a_marker_and_their_undos_in_reverse():
    from idemops_demo.tools.onboarding import ONBOARDING

    assert [step.name for step in ONBOARDING.plan(2)] == [
        "create_customer", "request_mandate", "failed:send_welcome_email", "compensate:request_mandate",
        "compensate:create_customer"]
    assert [step.name for step in ONBOARDING.plan(None)] == ["create_customer", "request_mandate",
                                                              "send_welcome_email"]
    # a first step that fails has nothing to undo: the task simply fails
    assert not ONBOARDING.compensates_before(0) and ONBOARDING.compensates_before(1)


# --- through MCP: a real client, the web server and a worker cluster -----------------------------


def result_of(url, token, task_id) -> dict:
    from tests.support.mcp_client import call_sync, error_of

    for _ in range(4):  # wait_seconds is at most 60: an agent that will wait longer calls again
        answer = call_sync(url, token, "get_task_result", {"task_id": task_id, "wait_seconds": 60})
        if not (answer.is_error and error_of(answer)["class"] == "in_progress"):
            break
    assert not answer.is_error, answer.structured_content
    return answer.structured_content["result"]


@pytest.mark.live
@pytest.mark.usefixtures("settle_tasks")
def test_an_mcp_client_runs_both_long_tools_as_tasks_and_reads_their_results(web_server, token, gateway, sink):
    from tests.support.mcp_client import call_sync
    from tests.support.processes import Worker, downstream_env
    from tools_app.models import Tenant

    # given the token's tenant's tickets, and a worker cluster pointed at the gateway and the mail sink
    acme = Tenant.objects.get(slug="acme")
    ids = tickets(acme, 3)
    worker = Worker(name="long-tools-mcp", **downstream_env(gateway, sink))
    try:
        # when a real MCP client calls each long tool with its idempotency key, then asks for the result
        calls = {"process_ticket_batch": {"ticket_ids": [*ids, 999_999], "idempotency_key": "mcp-batch",
                                          "change": {"type": "set_priority", "priority": "high"}},
                 "onboard_customer": {**ONBOARD, "idempotency_key": "mcp-onboard"}}
        for tool, arguments in calls.items():
            answer = call_sync(web_server.mcp_url, token, tool, arguments)
            assert not answer.is_error or answer.structured_content["error"]["class"] == "in_progress", (
                answer.structured_content)
        tasks = {tool: str(Task.objects.get(tenant=acme, tool=tool).pk) for tool in calls}
        results = {tool: result_of(web_server.mcp_url, token, task_id) for tool, task_id in tasks.items()}
    finally:
        worker.stop(grace=3)

    # then each ran as a durable task of that tenant and did its work once
    assert [(item["ticket_id"], item["outcome"]) for item in results["process_ticket_batch"]["items"]] == [
        *((pk, "changed") for pk in ids), (999_999, "not_found")]
    assert set(Ticket.objects.filter(pk__in=ids).values_list("priority", flat=True)) == {"high"}
    customer = Customer.objects.get(task_id=tasks["onboard_customer"])
    assert customer.tenant_id == acme.pk and results["onboard_customer"]["mandate_id"] == customer.mandate_id
    assert [status for _, _, status in gateway.mandates()] == ["active"]
    assert sink.messages() == {results["onboard_customer"]["welcome_email_id"]: 1}
