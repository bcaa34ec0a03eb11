"""A programming error is not transient (issue 27 §3): a write or a task step that raises an unexpected
exception fails once, as `internal_error`, with its type and a reference an operator finds, and is
not run again; infrastructure failures stay `transient`; a key whose runs keep being refused before anything is done
closes as `not_executed` after its retry window (issue 36 §1), and one whose runs keep ending uncertain
goes to the operators' queue after IDEMOPS_MAX_ATTEMPTS_PER_KEY of them instead of running again."""

from datetime import timedelta

import pytest
from django.db import OperationalError
from django.urls import reverse

from idemops_demo.models import Order
from idemops_demo.tools import orders
from tests.support.operators import make_operator
from tests.support.tasks_support import TEXT, agent, start
from tools_app import engine, reconciliation, tasks
from tools_app.access.roles import OPERATOR
from tools_app.conf import override_conf
from tools_app.core import clock, polling
from tools_app.core.errors import INTERNAL_ERROR_ADVICE, InternalError, PermissionDenied, UnknownOutcome
from tools_app.engine import Operation
from tools_app.models import AuditEvent, IdempotencyRecord, RecordStatus, StepRun, Task, TaskStatus
from tools_app.tasks import jobs as task_jobs
from tools_app.toolkit.calls import call_tool
from tools_app.toolkit.policies import NotDone
from tools_app.toolkit.registry import get_tool

ORDER = {"customer": "Jane Roe", "currency": "EUR", "items": [{"sku": "BOLT-1", "quantity": 1, "unit_price": "2.50"}]}


def create_order(caller, key="o-1"):
    return call_tool(get_tool("create_order"), caller, {**ORDER, "idempotency_key": key})


def its_wait_is_over(key):
    """The record's retry_not_before is now, by the database's clock."""
    IdempotencyRecord.objects.filter(key=key).update(retry_not_before=clock.NOW)


@pytest.fixture
def buggy_orders(monkeypatch):
    """create_order has a bug: after writing the order, building its answer raises KeyError (whose text
    holds the customer's name, as a real one might)."""
    runs = []

    def broken(order, lines):
        runs.append(order.pk)
        raise KeyError(f"customer {order.customer}")

    monkeypatch.setattr(orders, "order_output", broken)
    return runs


# --- writes ------------------------------------------------------------------------------------------------


def test_a_write_that_raises_a_key_error_fails_once_as_internal_error_and_no_retry_runs_it_again(
        caller, buggy_orders):
    # when: the agent calls, and retries with the same key even after any backoff would be over
    first = create_order(caller)
    assert IdempotencyRecord.objects.get().retry_not_before is None  # no backoff: nothing to wait for
    its_wait_is_over("o-1")
    again = create_order(caller)
    its_wait_is_over("o-1")
    third = create_order(caller)

    # then: the handler ran once; nothing of it committed; the record is FAILED, final
    record = IdempotencyRecord.objects.get()
    assert len(buggy_orders) == 1 and Order.objects.count() == 0
    assert (record.status, record.error_class, record.attempts) == (RecordStatus.FAILED, "internal_error", 1)
    # every answer: the class, the error's type, never its text, and the reference to report
    for answer in (first, again, third):
        error = answer.error.as_dict()
        assert error["class"] == "internal_error" and "retry_after" not in error
        assert error["reference"] == str(record.operation_id) and str(record.operation_id) in error["message"]
        assert "KeyError" in error["message"] and INTERNAL_ERROR_ADVICE in error["message"]
        assert "Jane Roe" not in error["message"]
    assert "Jane Roe" not in record.error_message
    assert (again.replayed, third.replayed) == (True, True)


def test_an_operator_finds_the_record_by_the_reference_of_an_internal_error(caller, client, tenant, buggy_orders):
    reference = create_order(caller).error.details["reference"]
    client.force_login(make_operator("olga", OPERATOR, tenant))

    found = client.post(reverse("admin:find"), {"q": reference})
    page = client.get(found.url)

    record = IdempotencyRecord.objects.get()
    assert found.status_code == 303
    assert found.url == reverse("admin:tools_app_idempotencyrecord_change", args=[record.pk])
    assert reference in page.content.decode() and "internal_error" in page.content.decode()


@pytest.mark.parametrize("infrastructure", [OperationalError("server closed the connection unexpectedly"),
                                            ConnectionResetError("reset by peer"), TimeoutError("timed out")])
def test_an_infrastructure_failure_stays_transient_and_the_same_key_runs_again(tenant, infrastructure):
    op = Operation(tenant_id=tenant.pk, tool="create_order", key="k-1", arguments={"n": 1}, actor="agent:acme/t")
    runs = []

    def flaky(record):
        runs.append(record.attempts)
        if len(runs) == 1:
            raise infrastructure
        return {"ok": True}

    first = engine.run(op, flaky)
    its_wait_is_over("k-1")
    second = engine.run(op, flaky)

    assert first.error.error_class == "transient" and first.error.retry_after > 0
    assert second.error is None and second.result == {"ok": True}
    assert runs == [1, 2]


# --- the cap on runs per key ---------------------------------------------------------------------------------


def test_runs_refused_before_acting_never_count_toward_the_cap_and_close_as_not_executed_after_the_window(
        tenant, settings):
    # given: at most three uncertain runs per key, a one-second retry window, and a handler whose database
    # connection always breaks (its transaction rolls back: nothing was done)
    override_conf(settings, max_attempts_per_key=3)
    op = Operation(tenant_id=tenant.pk, tool="create_order", key="k-1", arguments={"n": 1}, actor="agent:acme/t",
                   retry_window=timedelta(seconds=1))
    runs = []

    def always_down(record):
        runs.append(record.attempts)
        raise OperationalError("the database went away")

    # when: the agent retries as told, five times, more than the cap
    answers = []
    for _ in range(5):
        answers.append(engine.run(op, always_down))
        its_wait_is_over("k-1")
    record = IdempotencyRecord.objects.get()

    # then: five runs, none counted as uncertain, none escalated; each answer names the window's end
    assert runs == [1, 2, 3, 4, 5] and record.uncertain_runs == 0 and record.escalated_at is None
    assert [a.error.error_class for a in answers] == ["transient"] * 5
    assert {a.error.details["retry_until"] for a in answers} == {record.retry_until.isoformat()}

    # when: the window has passed (by the database's clock) and the agent asks again
    polling.until(lambda: clock.read() > record.retry_until, seconds=30, pause=0.05)
    closed = engine.run(op, always_down)
    again = engine.run(op, always_down)

    # then: FAILED for good, not_executed, saying nothing was done; nobody is asked to decide
    record.refresh_from_db()
    assert runs == [1, 2, 3, 4, 5]
    assert closed.error.error_class == again.error.error_class == "not_executed"
    assert "nothing was done" in closed.error.message and "new key" in closed.error.message
    assert (record.status, record.error_class, record.escalated_at) == (RecordStatus.FAILED, "not_executed", None)
    assert AuditEvent.objects.filter(object_id=str(record.pk), action="record.not_executed").count() == 1
    assert not AuditEvent.objects.filter(object_id=str(record.pk), action="record.escalated").exists()


def test_runs_with_an_uncertain_outcome_go_to_the_operators_queue_after_the_cap(tenant, settings):
    # given: at most two uncertain runs per key, and a downstream call that never answers
    override_conf(settings, max_attempts_per_key=2)
    op = Operation(tenant_id=tenant.pk, tool="request_payment", key="k-1", arguments={"n": 1}, actor="agent:acme/t",
                   transactional=False)
    runs = []

    def no_answer(record):
        runs.append(record.attempts)
        raise UnknownOutcome("the request was sent but no answer came back")

    # when: each run's outcome is unknown, and the reconciler then finds it was not done
    for _ in range(2):
        assert engine.run(op, no_answer).error.error_class == "unknown_outcome"
        record = IdempotencyRecord.objects.get()
        reconciliation.apply_answer(record, NotDone("the downstream has no such payment"), actor="system:reconciler")
    third = engine.run(op, no_answer)

    # then: two runs, then the record waits for a person in the UNKNOWN queue, flagged
    record = IdempotencyRecord.objects.get()
    assert runs == [1, 2] and third.error.error_class == "unknown_outcome"
    assert (record.status, record.uncertain_runs) == (RecordStatus.UNKNOWN, 2) and record.escalated_at is not None
    assert record.next_reconcile_at is None and "gave up after 2 runs" in record.error_message
    assert AuditEvent.objects.filter(object_id=str(record.pk), action="record.escalated").count() == 1

    # and: an operator who resolves it as failed gives the key a new budget of runs
    olga = make_operator("olga", OPERATOR, tenant)
    reconciliation.resolve_by_operator(record, olga, succeeded=False, reason="the gateway has no such payment")
    after = engine.run(op, lambda record: runs.append(record.attempts) or {"ok": True})
    assert after.error is None and runs == [1, 2, 1]


# --- task steps -------------------------------------------------------------------------------------------


@pytest.fixture
def buggy_chunking(monkeypatch):
    """The ingest pipeline's chunk step has a bug: it raises KeyError."""
    from idemops_demo import documents

    runs = []

    def broken(text, size):
        runs.append(size)
        return {}["chunk_size"]

    monkeypatch.setattr(documents, "chunk", broken)
    return runs


def test_a_task_step_that_raises_a_key_error_fails_the_task_at_once_with_internal_error(
        transactional_db, caller, fast, buggy_chunking):
    task = start(caller, {"text": TEXT})

    outcome = task_jobs.run_task(str(task.pk))

    task.refresh_from_db()
    assert outcome == "failed" and len(buggy_chunking) == 1
    assert (task.status, task.failure_class, task.attempts) == (TaskStatus.FAILED, "internal_error", 1)
    assert "KeyError" in task.failure_reason and str(task.pk) in task.failure_reason
    assert not AuditEvent.objects.filter(object_id=str(task.pk), action="task.retry_scheduled").exists()
    assert StepRun.objects.filter(task=task, step="chunk").count() == 1
    result = call_tool(get_tool("get_task_result"), caller, {"task_id": str(task.pk)})
    assert result.error.error_class == "internal_error" and result.error.details["reference"] == str(task.pk)
    assert "start a new task" not in result.error.message and "marks the cause fixed" in result.error.message


def test_resume_refuses_a_task_failed_by_a_bug_until_an_operator_marks_the_cause_fixed(
        transactional_db, caller, fast, tenant, monkeypatch, buggy_chunking):
    # (transactional: the step heartbeats renew the lease on their own connections)
    # given: a task failed by its chunk step's KeyError
    task = start(caller, {"text": TEXT})
    task_jobs.run_task(str(task.pk))
    task.refresh_from_db()

    # when: the agent resumes it: refused, with the reference; nothing ran again
    with pytest.raises(InternalError) as refused:
        tasks.resume(task, agent(caller))
    assert refused.value.details["reference"] == str(task.pk) and INTERNAL_ERROR_ADVICE in refused.value.message
    assert Task.objects.get(pk=task.pk).status == TaskStatus.FAILED and len(buggy_chunking) == 1

    # and the agent may not mark the cause fixed itself (refused and audited)
    with pytest.raises(PermissionDenied):
        tasks.mark_cause_fixed(task, agent(caller), reason="I think it is fine now")
    assert AuditEvent.objects.filter(action="task.mark_cause_fixed_refused", object_id=str(task.pk)).count() == 1

    # when: the bug is fixed and an operator says so
    monkeypatch.undo()
    olga = make_operator("olga", OPERATOR, tenant)
    tasks.mark_cause_fixed(Task.objects.get(pk=task.pk), olga, reason="release 1.4.2 fixes the chunker")
    fixed = AuditEvent.objects.get(action="task.cause_fixed", object_id=str(task.pk))
    assert fixed.actor == "user:olga" and "1.4.2" in fixed.reason

    # then: the agent's resume runs it again from its last checkpoint, to success
    resumed = tasks.resume(Task.objects.get(pk=task.pk), agent(caller))
    assert (resumed.status, resumed.attempts, resumed.cause_fixed_at) == (TaskStatus.CREATED, 1, None)
    assert task_jobs.run_task(str(task.pk)) == "succeeded"
    assert StepRun.objects.filter(task=task, step="receive").count() == 1  # before the bug: not run again


def test_a_pipeline_that_declares_an_exception_type_transient_retries_it(transactional_db, caller, fast,
                                                                         monkeypatch):
    from idemops_demo import documents
    from idemops_demo.tools.documents import INGEST

    class GlitchError(Exception):
        pass

    calls = []
    chunk = documents.chunk

    def glitchy(text, size):
        calls.append(size)
        if len(calls) == 1:
            raise GlitchError("the chunker's cache was cold")
        return chunk(text, size)

    monkeypatch.setattr(documents, "chunk", glitchy)
    declared = INGEST.transient
    object.__setattr__(INGEST, "transient", (*declared, GlitchError))  # as if the pipeline said so
    try:
        task = start(caller, {"text": TEXT})
        outcome = task_jobs.run_task(str(task.pk))
    finally:
        object.__setattr__(INGEST, "transient", declared)

    task.refresh_from_db()
    assert outcome == "succeeded" and len(calls) == 2 and task.attempts == 2
