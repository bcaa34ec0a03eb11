"""Workers SIGKILLed inside the new long tools: between a saga's steps, inside a compensation, and after a
chunk of tickets. Real `manage.py qcluster` processes, the real payment gateway and notification sink.

Worker A is armed with a crash point (the process SIGKILLs itself there) and its whole cluster is killed
once it died; worker B, unarmed, takes the task over after the sweep expired A's lease.
"""

from collections import Counter

import pytest

from idemops_demo.models import Customer, Ticket, TicketNote
from tests.support.processes import Worker, downstream_env, free_port
from tests.support.task_stack import swept_until, wait_until
from tools_app.models import Checkpoint, StepBatch, StepRun, Task, TaskStatus
from tools_app.toolkit.calls import call_tool
from tools_app.toolkit.registry import get_tool

pytestmark = pytest.mark.live

FAST = {"IDEMOPS_TASK_LEASE_SECONDS": "2", "IDEMOPS_TASK_HEARTBEAT_SECONDS": "0.3", "IDEMOPS_Q_WORKERS": "1",
        "IDEMOPS_TASK_BACKOFF_BASE_SECONDS": "0.2"}
ONBOARD = {"name": "Ada Lovelace", "email": "ada@example.com", "iban": "DE89370400440532013000"}


@pytest.fixture
def workers(gateway, sink):
    started = []

    def start(name, **env):
        worker = Worker(name=name, **{**downstream_env(gateway, sink), **FAST, **env})
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop(grace=3)


def start_task(caller, tool, arguments, key) -> Task:
    result = call_tool(get_tool("start_task"), caller, {"tool": tool, "arguments": arguments, "idempotency_key": key})
    assert result.error is None, result.error
    return Task.objects.get(pk=result.result["task_id"])


def killed_at_its_crash_point(worker) -> None:
    """Wait until the armed worker process died at its crash point; then kill its cluster (which would
    start a fresh worker process that dies there again)."""
    worker.wait_log("after death", timeout=120)
    worker.kill()


def step_runs(task) -> Counter:
    return Counter(StepRun.objects.filter(task=task).values_list("step", flat=True))


def checkpointed(task) -> list[str]:
    return list(Checkpoint.objects.filter(task=task).order_by("sequence").values_list("step", flat=True))


def test_a_worker_killed_between_saga_steps_resumes_and_calls_each_service_once(transactional_db, caller, gateway,
                                                                                 sink, workers):
    # given worker A, which dies right after its first checkpoint (create_customer)
    worker_a = workers("saga-between-a", IDEMOPS_CRASH_POINTS="after_checkpoint")
    task = start_task(caller, "onboard_customer", ONBOARD, "saga-between")
    killed_at_its_crash_point(worker_a)
    task.refresh_from_db()
    assert (task.status, checkpointed(task)) == (TaskStatus.RUNNING, ["create_customer"])
    assert gateway.mandates() == []

    # when worker B takes the task over
    workers("saga-between-b")
    assert swept_until_done(task, TaskStatus.SUCCEEDED)

    # then each service acted once: one customer, one mandate, one welcome email; create_customer ran once,
    # and the request_mandate run A opened with that checkpoint (same transaction) never finished
    assert Customer.objects.filter(task=task).count() == 1
    assert len(gateway.mandates()) == 1
    assert sink.messages() == {task.result["welcome_email_id"]: 1}
    assert step_runs(task) == Counter({"create_customer": 1, "request_mandate": 2, "send_welcome_email": 1})
    assert list(StepRun.objects.filter(task=task, step="request_mandate").order_by("started_at")
                .values_list("outcome", flat=True)) == ["running", "succeeded"]


def test_a_worker_killed_inside_a_compensation_runs_it_again_and_finishes_the_undo(transactional_db, caller, gateway,
                                                                                    workers):
    # given a welcome email that cannot be delivered (no mail server; one attempt, then dead-lettered),
    # and worker A, which dies inside the first compensation, after the gateway cancelled the mandate
    no_mail = {"IDEMOPS_EMAIL_PORT": str(free_port()), "IDEMOPS_OUTBOX_MAX_ATTEMPTS": "1"}
    worker_a = workers("saga-undo-a", IDEMOPS_CRASH_POINTS="in_compensation", **no_mail)
    task = start_task(caller, "onboard_customer", ONBOARD, "saga-undo")
    killed_at_its_crash_point(worker_a)
    task.refresh_from_db()
    assert checkpointed(task) == ["create_customer", "request_mandate", "failed:send_welcome_email"]
    [(mandate_id, status, cancelled_at)] = gateway.sql("SELECT id, status, cancelled_at FROM mandates")
    assert status == "cancelled" and task.status == TaskStatus.RUNNING

    # when worker B takes the task over
    workers("saga-undo-b", **no_mail)
    assert swept_until_done(task, TaskStatus.FAILED)

    # then the killed compensation ran again (changing nothing at the gateway), the next one ran once,
    # and the task failed with the email's error, saying what was undone, in reverse order
    assert gateway.sql("SELECT id, status, cancelled_at FROM mandates") == [(mandate_id, "cancelled", cancelled_at)]
    assert Customer.objects.get(task=task).status == Customer.Status.CLOSED
    assert task.failure_class == "invalid_input"
    assert "step send_welcome_email failed" in task.failure_reason
    assert "undone, in this order: request_mandate, create_customer" in task.failure_reason
    assert checkpointed(task) == ["create_customer", "request_mandate", "failed:send_welcome_email",
                                  "compensate:request_mandate", "compensate:create_customer"]
    assert step_runs(task) == Counter({"create_customer": 1, "request_mandate": 1, "send_welcome_email": 1,
                                       "compensate:request_mandate": 2, "compensate:create_customer": 1})


def test_a_worker_killed_after_a_chunk_of_tickets_resumes_at_the_next_chunk(transactional_db, tenant, caller,
                                                                             workers):
    # given 23 tickets to close in chunks of 5, and worker A, which dies right after its first chunk commits
    ids = [t.pk for t in Ticket.objects.bulk_create(Ticket(tenant=tenant, subject=f"t{n}", body="b")
                                                    for n in range(23))]
    worker_a = workers("tickets-a", IDEMOPS_CRASH_POINTS="after_batch", IDEMOPS_TICKET_BATCH_CHUNK="5")
    task = start_task(caller, "process_ticket_batch", {"ticket_ids": ids, "change": {"type": "close",
                                                                                      "note": "merged"}}, "tb")
    killed_at_its_crash_point(worker_a)
    first_chunk = dict(TicketNote.objects.values_list("ticket_id", "created_at"))
    assert sorted(first_chunk) == ids[:5]

    # when worker B takes the task over
    workers("tickets-b", IDEMOPS_TICKET_BATCH_CHUNK="5")
    assert swept_until_done(task, TaskStatus.SUCCEEDED)

    # then each ticket was closed once: one note each, the first chunk's notes from before the crash
    notes = dict(TicketNote.objects.values_list("ticket_id", "created_at"))
    assert TicketNote.objects.count() == 23 and sorted(notes) == sorted(ids)
    assert {pk: notes[pk] for pk in first_chunk} == first_chunk
    assert task.result["changed"] == 23 and [item["ticket_id"] for item in task.result["items"]] == ids
    assert StepBatch.objects.filter(task=task).count() == 5
    assert step_runs(task) == Counter({"apply": 2})


def swept_until_done(task, status) -> bool:
    wait_until(lambda: swept_until(task, TaskStatus.SUCCEEDED, TaskStatus.FAILED, TaskStatus.CANCELLED),
               timeout=180, what="the task to end")
    assert task.status == status, f"{task.status}: {task.failure_reason}"
    return True
