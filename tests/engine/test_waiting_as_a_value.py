"""A follower's wait is a value: `engine.start` answers a handle on the wait (core.polling.Pending),
and settling it goes on from where the follower waited, never from the top of the call."""

import threading
import time

from django.db import connections

from tools_app import engine
from tools_app.conf import conf, override_conf
from tools_app.core import polling
from tools_app.engine import Operation
from tools_app.models import IdempotencyRecord, RecordStatus


def payment(tenant, key="pay-1"):
    return Operation(tenant_id=tenant.pk, tool="request_payment", key=key, arguments={"amount": "10.00"},
                     actor="agent:acme/test", transactional=False)


def test_a_follower_gets_a_handle_on_its_wait_and_goes_on_from_it_to_the_executors_result(transactional_db, tenant):
    # given an executor whose downstream call is still running
    started, release, outcomes = threading.Event(), threading.Event(), []

    def slow(record):
        started.set()
        release.wait(30)
        return {"payment_id": f"pay-{record.pk}"}

    def executor():
        try:
            outcomes.append(engine.run(payment(tenant), slow))
        finally:
            connections.close_all()

    thread = threading.Thread(target=executor)
    thread.start()
    assert started.wait(30)
    ran_again = []

    # when a retry with the key starts
    before = time.monotonic()
    handle = engine.start(payment(tenant), lambda record: ran_again.append(record) or {"never": True})

    # then it answers at once with a handle on its wait, not an outcome, and has run nothing
    assert isinstance(handle, polling.Pending)
    assert before < handle.deadline <= time.monotonic() + conf().follower_wait_seconds
    assert not handle.check()  # the executor is still at work

    # and once the executor is done, settling the handle replays its result
    release.set()
    outcome = polling.settle(handle)
    thread.join(30)
    assert outcome.replayed and outcome.error is None
    assert outcome.result == outcomes[0].result == {"payment_id": f"pay-{outcome.record.pk}"}
    assert ran_again == []
    assert IdempotencyRecord.objects.get().status == RecordStatus.SUCCEEDED


def test_a_handle_whose_wait_runs_out_answers_in_progress_with_the_operation(transactional_db, tenant, settings):
    override_conf(settings, follower_wait_seconds=0.2)
    started, release = threading.Event(), threading.Event()

    def slow(record):
        started.set()
        release.wait(30)
        return {"payment_id": "late"}

    def executor():
        try:
            engine.run(payment(tenant), slow)
        finally:
            connections.close_all()

    thread = threading.Thread(target=executor)
    thread.start()
    try:
        assert started.wait(30)
        # when a retry waits out its whole wait while the executor still works
        outcome = polling.settle(engine.start(payment(tenant), lambda record: {"never": True}))
        # then it hears in_progress, naming the one operation
        assert outcome.error is not None and outcome.error.error_class == "in_progress"
        assert outcome.record.pk == IdempotencyRecord.objects.get().pk
    finally:
        release.set()
        thread.join(30)
