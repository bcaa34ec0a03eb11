"""The engine against real PostgreSQL: claims, races, failures, expiry."""

import threading
from datetime import timedelta

import pytest
from django.db import connection, connections
from django.db.models.functions import Now
from django.utils import timezone

from idemops_demo.models import Order
from tests.support.race import in_thread, race, wait_for_lock_waiters
from tools_app import engine
from tools_app.conf import override_conf
from tools_app.core.errors import InvalidInput, Transient
from tools_app.engine import ExpiryPolicy, Operation
from tools_app.models import AuditEvent, IdempotencyRecord, RecordStatus


def operation(tenant, key="k-1", **overrides):
    fields = dict(tenant_id=tenant.pk, tool="create_order", key=key, arguments={"customer": "ACME", "n": 1},
                  actor="agent:acme/test")
    return Operation(**{**fields, **overrides})


def make_order(tenant):
    def execute(record):
        order = Order.objects.create(tenant=tenant, record=record, customer="ACME", currency="EUR", total=1)
        return {"order_id": order.pk}
    return execute


def test_the_first_call_executes_and_a_retry_replays_its_result(tenant):
    first = engine.run(operation(tenant), make_order(tenant))
    second = engine.run(operation(tenant), make_order(tenant))

    assert first.result == second.result == {"order_id": Order.objects.get().pk}
    assert (first.replayed, second.replayed) == (False, True)
    assert first.record.status == RecordStatus.SUCCEEDED
    assert list(AuditEvent.objects.values_list("action", flat=True)) == [
        "tenant.created", "record.claimed", "record.succeeded"]


def test_other_arguments_with_the_same_key_are_a_conflict_naming_the_fields(tenant):
    engine.run(operation(tenant), make_order(tenant))

    outcome = engine.run(operation(tenant, arguments={"customer": "ACME", "n": 2, "extra": True}),
                         make_order(tenant))

    assert outcome.error.error_class == "conflict"
    assert outcome.error.differing_fields == ["extra", "n"]
    assert Order.objects.count() == 1


def test_keys_are_scoped_by_tenant_and_tool(tenant, other_tenant):
    engine.run(operation(tenant), make_order(tenant))
    engine.run(operation(other_tenant), make_order(other_tenant))
    engine.run(operation(tenant, tool="create_ticket"), make_order(tenant))

    assert Order.objects.count() == 3


def test_a_handler_that_raises_after_writing_leaves_nothing_behind(tenant):
    def write_then_fail(record):
        Order.objects.create(tenant=tenant, record=record, customer="ACME", currency="EUR", total=1)
        raise RuntimeError("bug after the write")

    outcome = engine.run(operation(tenant), write_then_fail)

    assert Order.objects.count() == 0
    record = IdempotencyRecord.objects.get()
    assert (record.status, record.error_class) == (RecordStatus.FAILED, "internal_error")
    assert outcome.error.error_class == "internal_error" and "after the write" not in outcome.error.message


def test_a_transient_failure_may_run_again_with_the_same_key(tenant):
    engine.run(operation(tenant), lambda record: (_ for _ in ()).throw(ConnectionError("reset")))
    IdempotencyRecord.objects.update(retry_not_before=timezone.now())

    outcome = engine.run(operation(tenant), make_order(tenant))

    assert outcome.error is None and not outcome.replayed
    assert outcome.record.attempts == 2
    assert Order.objects.count() == 1


def test_a_transient_failure_is_not_rerun_before_retry_after(tenant):
    engine.run(operation(tenant), lambda record: (_ for _ in ()).throw(ConnectionError("reset")))

    outcome = engine.run(operation(tenant), make_order(tenant))

    assert outcome.error.error_class == "transient"
    assert Order.objects.count() == 0


def test_a_deterministic_failure_is_replayed_as_the_same_error(tenant):
    def reject(record):
        raise InvalidInput("unknown sku X")

    first = engine.run(operation(tenant), reject)
    second = engine.run(operation(tenant), make_order(tenant))

    assert first.error.as_dict() == second.error.as_dict() == {"class": "invalid_input", "message": "unknown sku X"}
    assert second.replayed and Order.objects.count() == 0


def expire(record_filter=None):
    IdempotencyRecord.objects.update(expires_at=timezone.now() - timedelta(seconds=1))


def test_past_retention_a_reexecute_tool_runs_as_a_new_operation(tenant):
    first = engine.run(operation(tenant), make_order(tenant))
    expire()

    second = engine.run(operation(tenant, arguments={"customer": "ACME", "n": 5}), make_order(tenant))

    assert second.error is None and not second.replayed
    assert second.result != first.result
    assert Order.objects.count() == 2
    old = IdempotencyRecord.objects.get(pk=first.record.pk)
    assert old.retired_at is not None  # kept for auditors, key freed


def test_past_retention_a_hold_tool_answers_expired(tenant):
    op = operation(tenant, on_expiry=ExpiryPolicy.HOLD)
    engine.run(op, make_order(tenant))
    expire()

    outcome = engine.run(op, make_order(tenant))

    assert outcome.error.error_class == "expired"
    assert Order.objects.count() == 1


def test_a_follower_of_a_running_call_gets_in_progress_after_a_bounded_wait(tenant, settings):
    override_conf(settings, follower_wait_seconds=0.2)
    record, claimed = engine.claim(operation(tenant))
    assert claimed

    outcome = engine.run(operation(tenant), make_order(tenant))

    assert outcome.error.error_class == "in_progress"
    assert outcome.error.retry_after > 0
    assert Order.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_two_claims_interleaved_at_the_insert_make_one_executor(tenant):
    # given: A has inserted its claim but not committed
    a_inserted, release_a = threading.Event(), threading.Event()
    results = {}

    def claim_a():
        from django.db import transaction
        with transaction.atomic():
            results["a"] = engine.claim(operation(tenant))
            a_inserted.set()
            release_a.wait(10)
        connections.close_all()

    def claim_b():
        a_inserted.wait(10)
        results["b"] = engine.claim(operation(tenant))
        connections.close_all()

    threads = [threading.Thread(target=claim_a), threading.Thread(target=claim_b)]
    for t in threads:
        t.start()
    # when: B's INSERT is blocked on A's uncommitted row, and A commits
    wait_for_lock_waiters(1)
    release_a.set()
    for t in threads:
        t.join(10)

    # then
    (record_a, a_won), (record_b, b_won) = results["a"], results["b"]
    assert (a_won, b_won) == (True, False)
    assert record_a.pk == record_b.pk
    assert IdempotencyRecord.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_many_concurrent_identical_calls_execute_once(tenant):
    calls = race(*[lambda: engine.run(operation(tenant), make_order(tenant))] * 16, timeout=30)
    outcomes = calls.results

    assert calls.answered(16) and not calls.errors
    assert Order.objects.count() == 1
    assert {o.result["order_id"] for o in outcomes if o.error is None} == {Order.objects.get().pk}
    assert sum(not o.replayed for o in outcomes if o.error is None) == 1


# --- a local call's claim is part of its transaction ------------------------------------------------


def seen_from_another_connection(query):
    """Run `query()` on a fresh connection of another thread (what a concurrent caller sees)."""
    thread, seen = in_thread(query)
    thread.join(10)
    return seen[0]


@pytest.mark.django_db(transaction=True)
def test_a_local_calls_record_is_invisible_to_other_callers_until_it_commits_with_its_effect(tenant):
    # given a local write whose handler looks at the key from another connection
    def execute(record):
        execute.seen = seen_from_another_connection(lambda: IdempotencyRecord.objects.count())
        return make_order(tenant)(record)

    # when
    outcome = engine.run(operation(tenant), execute)

    # then nobody saw a PROCESSING record: claim, order and outcome committed together
    assert execute.seen == 0
    assert outcome.error is None and outcome.record.status == RecordStatus.SUCCEEDED
    assert Order.objects.count() == 1


class HeldExecutor:
    """A local call whose handler waits inside its transaction until released."""

    def __init__(self, tenant):
        self.tenant = tenant
        self.started, self.release = threading.Event(), threading.Event()
        self.outcome = self.error = self.backend_pid = None
        self.thread = threading.Thread(target=self._call)

    def _handler(self, record):
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            self.backend_pid = cursor.fetchone()[0]
        self.started.set()
        self.release.wait(20)
        return make_order(self.tenant)(record)

    def _call(self):
        try:
            self.outcome = engine.run(operation(self.tenant), self._handler)
        except Exception as exc:  # a killed connection, in the test that kills it
            self.error = exc
        finally:
            connections.close_all()

    def __enter__(self):
        self.thread.start()
        assert self.started.wait(10)
        return self

    def __exit__(self, *exc):
        self.release.set()
        self.thread.join(20)


@pytest.mark.django_db(transaction=True)
def test_a_follower_of_a_local_call_in_flight_waits_for_its_commit_and_replays_its_result(tenant, settings):
    override_conf(settings, follower_wait_seconds=20)
    with HeldExecutor(tenant) as executor:
        # given a follower whose claim waits on the executor's uncommitted one
        follower, answers = in_thread(lambda: engine.run(operation(tenant), make_order(tenant)))
        wait_for_lock_waiters(1)
        # when the executor commits
        executor.release.set()
    follower.join(20)

    # then the follower answers the committed result at once: a replay, not in_progress
    assert executor.outcome.error is None and executor.outcome.executed
    assert answers[0].error is None and answers[0].replayed
    assert answers[0].result == executor.outcome.result == {"order_id": Order.objects.get().pk}


@pytest.mark.django_db(transaction=True)
def test_a_follower_of_a_local_call_running_past_the_follower_wait_hears_in_progress(tenant, settings):
    override_conf(settings, follower_wait_seconds=0.3)
    with HeldExecutor(tenant) as executor:
        # when a follower comes while the executor holds its transaction longer than the follower wait
        follower, answers = in_thread(lambda: engine.run(operation(tenant), make_order(tenant)))
        follower.join(20)
        assert not follower.is_alive()

    # then it heard in_progress naming the operation id the executor's record committed with (it
    # could read no record: a stand-in, not saved), and the executor went on
    assert answers[0].error.error_class == "in_progress" and answers[0].record.pk is None
    assert executor.outcome.error is None and Order.objects.count() == 1
    assert answers[0].record.operation_id == IdempotencyRecord.objects.get().operation_id


def test_a_call_that_keeps_losing_the_key_to_other_retries_hears_in_progress_naming_the_operation(tenant):
    # given a key whose first run failed transiently and may run again now
    def fail(record):
        raise Transient("downstream busy")

    failed = engine.run(operation(tenant), fail).record
    IdempotencyRecord.objects.filter(pk=failed.pk).update(retry_not_before=Now())
    with connection.cursor() as cursor:
        # every reclaim of it loses, as to another retry that got there first
        cursor.execute("CREATE FUNCTION test_lose_reclaim() RETURNS trigger LANGUAGE plpgsql AS "
                       "$$ BEGIN RETURN NULL; END $$")
        cursor.execute(f"CREATE TRIGGER test_lose_reclaim BEFORE UPDATE ON {IdempotencyRecord._meta.db_table} "
                       "FOR EACH ROW WHEN (OLD.status = 'failed' AND NEW.status = 'processing') "
                       "EXECUTE FUNCTION test_lose_reclaim()")

    outcome = engine.run(operation(tenant), make_order(tenant))

    assert outcome.error.error_class == "in_progress" and "changing hands" in outcome.error.message
    assert outcome.record.operation_id == failed.operation_id and Order.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_a_key_used_again_after_its_retention_is_a_new_operation_id_which_its_follower_names(tenant, settings):
    override_conf(settings, follower_wait_seconds=0.3)
    # given a key whose first operation was retired after its retention
    first = engine.run(operation(tenant), make_order(tenant)).record
    IdempotencyRecord.objects.filter(pk=first.pk).update(retired_at=timezone.now())
    with HeldExecutor(tenant) as executor:
        # when a follower gives up waiting for the key's second, uncommitted operation
        follower, answers = in_thread(lambda: engine.run(operation(tenant), make_order(tenant)))
        follower.join(20)

    # then it names that second operation, which is not the first one
    second = IdempotencyRecord.objects.get(retired_at__isnull=True)
    assert executor.outcome.error is None and executor.outcome.record.pk == second.pk
    assert answers[0].error.error_class == "in_progress"
    assert answers[0].record.operation_id == second.operation_id != first.operation_id


@pytest.mark.django_db(transaction=True)
def test_a_local_executor_whose_connection_dies_leaves_the_key_to_the_waiting_follower(tenant, settings):
    override_conf(settings, follower_wait_seconds=20)
    with HeldExecutor(tenant) as executor:
        # given a follower waiting on the executor's uncommitted claim
        follower, answers = in_thread(lambda: engine.run(operation(tenant), make_order(tenant)))
        wait_for_lock_waiters(1)
        # when the executor's database session dies (a crash: nothing was committed)
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [executor.backend_pid])
        follower.join(20)

    # then the follower claimed the free key and ran it: one order, nothing left of the dead claim
    assert executor.error is not None
    assert answers[0].error is None and answers[0].executed
    assert Order.objects.count() == 1
    record = IdempotencyRecord.objects.get()
    assert (record.status, record.attempts) == (RecordStatus.SUCCEEDED, 1)


@pytest.mark.django_db(transaction=True)
def test_the_executors_own_statements_after_the_claim_keep_the_sessions_lock_timeout(tenant):
    # given a session whose lock_timeout is not the default
    with connection.cursor() as cursor:
        cursor.execute("SET lock_timeout = '7s'")

    def execute(record):
        with connection.cursor() as cursor:
            cursor.execute("SHOW lock_timeout")
            execute.seen = cursor.fetchone()[0]
        return make_order(tenant)(record)

    # when
    engine.run(operation(tenant), execute)

    # then the claim's bounded wait did not leak into the handler's statements
    assert execute.seen == "7s"
    with connection.cursor() as cursor:
        cursor.execute("RESET lock_timeout")
