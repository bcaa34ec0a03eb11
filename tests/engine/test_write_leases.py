"""Write leases: short, kept alive by a heartbeat, and taken over by the first caller that finds one expired."""

import logging
import threading
import time
from datetime import timedelta

import pytest
from django.db import connections, transaction
from django.utils import timezone
from django_q.models import OrmQ

from idemops_demo.models import Order
from tools_app import engine
from tools_app.conf import override_conf
from tools_app.engine import Operation
from tools_app.models import AuditEvent, IdempotencyRecord, RecordStatus

ARGUMENTS = {"customer": "ACME", "n": 1}


def operation(tenant, key="k-1", **overrides):
    return Operation(**{**dict(tenant_id=tenant.pk, tool="create_order", key=key, arguments=ARGUMENTS,
                               actor="agent:acme/test"), **overrides})


def make_order(tenant, pause: float = 0.0):
    def execute(record):
        time.sleep(pause)
        order = Order.objects.create(tenant=tenant, record=record, customer="ACME", currency="EUR", total=1)
        return {"order_id": order.pk}
    return execute


@pytest.fixture
def short_leases(settings):
    override_conf(settings, execution_lease_seconds=0.6, execution_heartbeat_seconds=0.1)


def claimed_by_a_dead_executor(op: Operation) -> IdempotencyRecord:
    """A claim whose executor died right after it: PROCESSING, and its lease already ran out."""
    record, claimed = engine.claim(op)
    assert claimed
    IdempotencyRecord.objects.filter(pk=record.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    record.refresh_from_db()
    return record


def actions(record) -> list[tuple[str, str]]:
    return list(AuditEvent.objects.filter(object_type="idempotencyrecord", object_id=str(record.pk))
                .order_by("pk").values_list("action", "actor"))


class Sweeper:
    """The lease sweep running in another process, as often as it can, while a call runs."""

    def __init__(self):
        self.stop = threading.Event()
        self.expired: list[int] = []
        self.thread = threading.Thread(target=self.run)

    def run(self):
        try:
            while not self.stop.is_set():
                self.expired += [r.pk for r in engine.expire_leases()]
                time.sleep(0.05)
        finally:
            connections.close_all()

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(10)


def slow_downstream_call(pause: float, started: threading.Event | None = None):
    """A handler standing for a slow downstream request (its record is claimed by a commit of its own)."""
    def execute(record):
        if started is not None:
            started.set()
        time.sleep(pause)
        return {"payment_id": f"pay-{record.pk}"}
    return execute


def downstream_operation(tenant, key="k-1"):
    return operation(tenant, key=key, tool="request_payment", transactional=False)


def test_the_heartbeat_keeps_a_slow_handlers_lease_beyond_the_lease_length(transactional_db, tenant, short_leases):
    # given a downstream call that runs four times longer than the lease, with the sweep running all along
    with Sweeper() as sweeper:
        # when
        outcome = engine.run(downstream_operation(tenant), slow_downstream_call(2.4))

    # then nobody took it for dead: it succeeded once, never UNKNOWN
    assert outcome.error is None and outcome.executed
    assert sweeper.expired == []
    record = IdempotencyRecord.objects.get()
    assert record.status == RecordStatus.SUCCEEDED
    assert [action for action, _ in actions(record)] == ["record.claimed", "record.succeeded"]


def test_a_lost_lease_is_detected_and_the_late_executor_records_nothing(transactional_db, tenant, short_leases,
                                                                        caplog):
    # given a running downstream call whose record another process takes for dead (its clock, or a
    # partition that kept the heartbeat from the database, let the lease look expired)
    started = threading.Event()

    def take_it_for_dead():
        started.wait(10)
        record = IdempotencyRecord.objects.get()
        assert engine.expire_lease(record, now=timezone.now() + timedelta(seconds=5))
        connections.close_all()

    thief = threading.Thread(target=take_it_for_dead)
    thief.start()

    # when
    with caplog.at_level(logging.WARNING, logger="tools_app.core.leases"):
        outcome = engine.run(downstream_operation(tenant), slow_downstream_call(1.0, started))
    thief.join(10)

    # then its heartbeat noticed, its success was refused, and reconciliation owns the record
    assert any("no longer ours" in message for message in caplog.messages)
    assert outcome.error.error_class == "unknown_outcome"
    record = IdempotencyRecord.objects.get()
    assert record.status == RecordStatus.UNKNOWN
    assert "record.succeeded" not in [action for action, _ in actions(record)]


def test_a_handler_holding_a_lock_on_its_own_record_is_not_stuck_behind_its_heartbeat(transactional_db, tenant,
                                                                                      short_leases):
    # given a handler whose own transaction locks its record for several heartbeat intervals
    def locking_call(record):
        with transaction.atomic():
            IdempotencyRecord.objects.select_for_update().get(pk=record.pk)
            time.sleep(0.5)
        return {"payment_id": "p-1"}

    outcomes = []

    def call():
        try:
            outcomes.append(engine.run(downstream_operation(tenant), locking_call))
        finally:
            connections.close_all()

    # when
    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    caller.join(20)

    # then the heartbeat skipped the beats it could not make instead of holding up the executor
    assert not caller.is_alive(), "the call hung: its heartbeat queued behind its own transaction's lock"
    assert outcomes[0].error is None


def test_a_retry_that_finds_a_dead_executors_lease_expired_runs_a_local_tool_at_once(tenant):
    # given a create_order whose executor died after its claim
    record = claimed_by_a_dead_executor(operation(tenant))

    # when the agent retries with the same key
    outcome = engine.run(operation(tenant), make_order(tenant))

    # then the retry took the record over itself (nothing committed: settled as not done) and ran it
    assert outcome.error is None and outcome.executed
    assert Order.objects.count() == 1
    record.refresh_from_db()
    assert (record.status, record.attempts) == (RecordStatus.SUCCEEDED, 2)
    assert actions(record) == [
        ("record.claimed", "agent:acme/test"), ("record.unknown", "agent:acme/test"),
        ("record.reconciled", "system:reconciler"), ("record.reclaimed", "agent:acme/test"),
        ("record.succeeded", "agent:acme/test")]
    assert record.evidence[0]["source"] == "follower"


def test_a_retry_that_finds_a_downstream_calls_lease_expired_answers_unknown_and_queues_its_reconciliation(tenant):
    # given a request_payment whose executor died: it may have paid
    op = operation(tenant, tool="request_payment", transactional=False)
    record = claimed_by_a_dead_executor(op)
    queued = OrmQ.objects.count()

    # when
    outcome = engine.run(op, lambda record: pytest.fail("a dead executor's payment must not run again"))

    # then the agent hears at once that it is being reconciled, and the reconciliation is queued now
    assert outcome.error.error_class == "unknown_outcome"
    record.refresh_from_db()
    assert record.status == RecordStatus.UNKNOWN and record.next_reconcile_at <= timezone.now()
    assert OrmQ.objects.count() == queued + 1


def test_a_follower_waiting_on_an_executor_takes_over_as_soon_as_its_lease_runs_out(tenant, settings):
    # given an executor that died with a lease that runs out in a moment, and a patient follower
    override_conf(settings, execution_lease_seconds=0.5, execution_heartbeat_seconds=0.1, follower_wait_seconds=30)
    record, claimed = engine.claim(operation(tenant))
    assert claimed

    # when
    outcome = engine.run(operation(tenant), make_order(tenant))

    # then it did not wait out its 30 s for an answer that could never come: it ran the order
    assert outcome.error is None and Order.objects.count() == 1
    assert ("record.unknown", "agent:acme/test") in actions(record)


def test_a_live_executors_lease_is_not_taken(tenant):
    record, _ = engine.claim(operation(tenant))

    assert not engine.expire_lease(record)
    assert engine.expire_leases() == []
    record.refresh_from_db()
    assert record.status == RecordStatus.PROCESSING


@pytest.mark.live
def test_the_cluster_settles_a_dead_executors_key_within_seconds_with_no_caller_and_no_schedule(transactional_db,
                                                                                                 tenant):
    from django_q.models import Schedule

    from tests.support.processes import Worker

    # given a key whose executor died, that nobody asks about, and no minute schedule to sweep it
    Schedule.objects.all().delete()
    record = claimed_by_a_dead_executor(operation(tenant))

    # when a django-q2 cluster runs
    worker = Worker("lease-loop", IDEMOPS_LEASE_SWEEP_SECONDS="0.2")
    try:
        deadline = time.monotonic() + 30
        while IdempotencyRecord.objects.get(pk=record.pk).status != RecordStatus.FAILED:
            assert time.monotonic() < deadline, "the cluster's loop never swept the expired lease"
            time.sleep(0.1)
    finally:
        worker.stop(grace=3)

    # then its loop took the lease for dead and reconciled it (nothing committed: the same key may run again)
    assert actions(record)[1:] == [("record.unknown", "system:lease-sweep"), ("record.reconciled", "system:reconciler")]
    record.refresh_from_db()
    assert (record.status, record.error_class) == (RecordStatus.FAILED, "transient")
