"""get_operation: what became of an operation, by its operation_id or by (tool, idempotency_key).

In-process against real PostgreSQL; long tasks run by calling their job in this process.
"""

import threading

import pytest
from django.db import connection, connections, transaction
from django.utils import timezone

from idemops_demo.models import Order
from tests.support.approvals_support import STAFF_NOTE
from tests.support.issued_ids import call_labelled
from tests.support.race import in_thread, wait_for_lock_waiters
from tests.support.tasks_support import TEXT
from tools_app import engine, reconciliation
from tools_app.conf import override_conf
from tools_app.mcp.runtime import idempotency_info
from tools_app.models import IdempotencyRecord, Task
from tools_app.tasks import jobs as task_jobs
from tools_app.toolkit.calls import Caller, call_tool, validate_arguments, write_operation
from tools_app.toolkit.registry import get_tool

ORDER = {"customer": "ACME", "currency": "EUR", "items": [{"sku": "BOLT-1", "quantity": 3, "unit_price": "2.50"}]}


def get_operation(caller, **lookup):
    return call_tool(get_tool("get_operation"), caller, lookup)


def create_order(caller, key="o-1", **overrides):
    return call_tool(get_tool("create_order"), caller, {**ORDER, **overrides, "idempotency_key": key})


def test_a_finished_operation_answers_its_state_and_first_result_by_id_and_by_key(caller):
    first = create_order(caller)
    operation_id = str(first.record.operation_id)

    by_id = get_operation(caller, operation_id=operation_id).result
    by_key = get_operation(caller, tool="create_order", idempotency_key="o-1").result

    assert by_id == by_key
    assert (by_id["operation_id"], by_id["tool"], by_id["status"]) == (operation_id, "create_order", "succeeded")
    assert by_id["result"] == first.result and by_id["error"] is None
    assert by_id["expires_at"] == first.record.expires_at.isoformat().replace("+00:00", "Z")


class HeldOrders:
    """A session holding a SHARE lock on the orders table: a create_order that has claimed its key
    waits there to insert its order, its transaction (and its claim) open, until released."""

    def __init__(self):
        self.locked, self.release = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._hold)

    def _hold(self):
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(f"LOCK TABLE {Order._meta.db_table} IN SHARE MODE")
                self.locked.set()
                self.release.wait(20)
        finally:
            connections.close_all()

    def __enter__(self):
        self.thread.start()
        assert self.locked.wait(10)
        return self

    def __exit__(self, *exc):
        self.release.set()
        self.thread.join(20)


@pytest.mark.django_db(transaction=True)
def test_an_in_progress_answer_names_the_uncommitted_first_call_which_get_operation_follows_to_its_result(
        caller, settings):
    override_conf(settings, follower_wait_seconds=0.3)
    with HeldOrders() as orders:
        # given a first create_order that claimed its key and is inside its transaction, not committed
        first, answers = in_thread(lambda: create_order(caller))
        wait_for_lock_waiters(1)
        # when a second call with the key gives up waiting for it
        follower = create_order(caller)
        handle = idempotency_info(follower)["operation_id"]
        # then its in_progress answer names the operation, and get_operation says it is running
        assert follower.error.error_class == "in_progress" and idempotency_info(follower)["status"] == "processing"
        assert handle is not None
        by_id = get_operation(caller, operation_id=handle).result
        by_key = get_operation(caller, tool="create_order", idempotency_key="o-1").result
        assert by_id == by_key and (by_id["operation_id"], by_id["tool"]) == (handle, "create_order")
        assert (by_id["status"], by_id["result"], by_id["expires_at"]) == ("processing", None, None)
        orders.release.set()
    first.join(20)

    # and once the first call commits, the same handle answers its result
    done = get_operation(caller, operation_id=handle).result
    assert answers[0].error is None and str(answers[0].record.operation_id) == handle
    assert (done["status"], done["result"]) == ("succeeded", answers[0].result) and Order.objects.count() == 1


@pytest.mark.live
def test_over_mcp_an_in_progress_answer_names_the_uncommitted_first_call_for_get_operation(web_server, token):
    from tests.support.mcp_client import call_sync, error_of

    def create():
        return call_sync(web_server.mcp_url, token, "create_order", {**ORDER, "idempotency_key": "o-1"})

    with HeldOrders() as orders:
        # given the server's first create_order inside its transaction, its claim not committed
        first, answers = in_thread(create)
        wait_for_lock_waiters(1)
        # when a second call with the key waits out the server's follower wait
        follower = create()
        handle = follower.structured_content["idempotency"]["operation_id"]
        running = call_sync(web_server.mcp_url, token, "get_operation", {"operation_id": handle})
        orders.release.set()
    first.join(20)
    done = call_sync(web_server.mcp_url, token, "get_operation", {"operation_id": handle})

    # then the agent held a handle that answered PROCESSING, then the first call's result
    assert error_of(follower)["class"] == "in_progress" and follower.structured_content["idempotency"]["status"] == (
        "processing")
    assert running.structured_content["status"] == "processing"
    assert answers[0].structured_content["idempotency"]["operation_id"] == handle
    assert done.structured_content["status"] == "succeeded"
    assert done.structured_content["result"]["order_id"] == answers[0].structured_content["order_id"]


@pytest.mark.django_db(transaction=True)
def test_a_follower_of_a_downstream_call_in_flight_hears_in_progress_with_its_operation_id(caller, tenant, settings):
    override_conf(settings, follower_wait_seconds=0.2)
    started, release = threading.Event(), threading.Event()

    def call_downstream(record):
        started.set()
        release.wait(20)
        return {"sent": True}

    payment = engine.Operation(tenant_id=tenant.pk, tool="request_payment", key="pay-1", arguments={"amount": 5},
                               transactional=False)
    first, answers = in_thread(lambda: engine.run(payment, call_downstream))
    try:
        assert started.wait(10)
        follower = engine.run(payment, call_downstream)
        handle = str(follower.record.operation_id)
        running = get_operation(caller, operation_id=handle).result
    finally:
        release.set()
        first.join(20)

    assert follower.error.error_class == "in_progress" and running["status"] == "processing"
    assert handle == str(answers[0].record.operation_id)
    assert get_operation(caller, operation_id=handle).result["result"] == {"sent": True}


def test_a_retry_while_an_approved_call_executes_hears_in_progress_with_its_operation_id(caller, settings):
    override_conf(settings, follower_wait_seconds=0)
    waiting = call_labelled(caller, "publish_announcement", {**STAFF_NOTE, "idempotency_key": "a-1"})
    record = IdempotencyRecord.objects.get(tool="publish_announcement")
    # the approval's job has taken the record and is executing it
    assert engine.start_approved(record, actor="system:approvals")

    retry = call_labelled(caller, "publish_announcement", {**STAFF_NOTE, "idempotency_key": "a-1"})

    assert waiting.error.error_class == "pending_approval"
    assert retry.error.error_class == "in_progress"
    assert idempotency_info(retry)["operation_id"] == str(record.operation_id) == idempotency_info(waiting)[
        "operation_id"]
    assert get_operation(caller, operation_id=str(record.operation_id)).result["status"] == "processing"


def test_a_deterministic_failure_answers_its_error(caller):
    deletion = {"kind": "order", "id": 999_999, "reason": "cleanup", "idempotency_key": "d-1"}
    failed = call_labelled(caller, "delete_record", deletion)

    answer = get_operation(caller, operation_id=str(failed.record.operation_id)).result

    assert answer["status"] == "failed" and answer["result"] is None
    assert answer["error"]["class"] == "not_found" and "no order 999999" in answer["error"]["message"]


def test_an_operation_waiting_for_a_person_answers_what_a_retry_would_be_told(caller):
    waiting = call_labelled(caller, "publish_announcement", {**STAFF_NOTE, "idempotency_key": "a-1"})

    answer = get_operation(caller, tool="publish_announcement", idempotency_key=waiting.record.key).result

    assert answer["status"] == "awaiting_approval"
    assert answer["error"] == waiting.error.as_dict() and answer["error"]["class"] == "pending_approval"


def test_an_unknown_outcome_answers_unknown_with_the_reconciliation_advice(caller):
    spec = get_tool("create_order")
    operation, _ = write_operation(spec, caller, validate_arguments(spec, {**ORDER, "idempotency_key": "o-1"}))
    record, _ = engine.claim(operation)
    IdempotencyRecord.objects.filter(pk=record.pk).update(lease_expires_at=timezone.now())
    engine.expire_leases()  # the executor died: UNKNOWN until reconciled

    answer = get_operation(caller, operation_id=str(record.operation_id)).result

    assert answer["status"] == "unknown" and answer["error"]["class"] == "unknown_outcome"
    reconciliation.run_periodic()  # a local write that never committed: settled as not done
    assert get_operation(caller, operation_id=str(record.operation_id)).result["status"] == "failed"


def test_another_tenants_operation_is_not_found_like_one_that_does_not_exist(caller, other_tenant):
    first = create_order(caller)
    theirs = Caller(other_tenant.pk, "agent:globex/x")

    for lookup in ({"operation_id": str(first.record.operation_id)}, {"tool": "create_order", "idempotency_key": "o-1"},
                   {"operation_id": "not-an-id"}, {"tool": "no_such_tool", "idempotency_key": "o-1"}):
        assert get_operation(theirs, **lookup).error.error_class == "not_found", lookup
    assert Order.objects.count() == 1


def test_an_issued_id_not_used_yet_is_not_found_and_says_so(caller):
    prepared = call_tool(get_tool("prepare_operation"), caller, {"tool": "publish_announcement",
                                                                  "arguments": STAFF_NOTE, "idempotency_key": "p"})

    answer = get_operation(caller, operation_id=prepared.result["operation_id"])

    assert answer.error.error_class == "not_found" and "no call has used it yet" in answer.error.message


def test_a_key_freed_after_its_retention_is_not_found(caller):
    first = create_order(caller)
    IdempotencyRecord.objects.filter(pk=first.record.pk).update(retired_at=timezone.now())

    assert get_operation(caller, operation_id=str(first.record.operation_id)).error.error_class == "not_found"


@pytest.mark.parametrize("lookup", [{}, {"tool": "create_order"}, {"idempotency_key": "o-1"},
                                    {"operation_id": "x", "tool": "create_order", "idempotency_key": "o-1"}])
def test_a_lookup_needs_exactly_one_form(caller, lookup):
    answer = get_operation(caller, **lookup)

    assert answer.error.error_class == "invalid_input"
    assert "give either operation_id, or tool and idempotency_key" in answer.error.message


def test_a_long_tool_called_directly_is_processing_until_its_task_ends_then_answers_the_tasks_result(
        transactional_db, caller, fast):
    direct = call_tool(get_tool("ingest_document"), caller, {"text": TEXT, "idempotency_key": "doc-1"})
    task = Task.objects.get()

    running = get_operation(caller, tool="ingest_document", idempotency_key="doc-1").result
    task_jobs.run_task(str(task.pk))
    done = get_operation(caller, operation_id=running["operation_id"]).result
    as_start_task = get_operation(caller, tool="start_task", idempotency_key="doc-1").result

    assert direct.error.error_class == "in_progress"
    assert (running["status"], running["tool"], running["task_id"]) == ("processing", "ingest_document", str(task.pk))
    assert running["error"]["class"] == "in_progress"
    assert (done["status"], done["result"]) == ("succeeded", Task.objects.get().result) and done["error"] is None
    assert running["operation_id"] == str(task.operation_id) == idempotency_info(direct)["operation_id"]
    assert as_start_task["result"]["task_id"] == str(task.pk) and as_start_task["tool"] == "start_task"
