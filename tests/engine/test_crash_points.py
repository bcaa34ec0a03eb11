"""A web process SIGKILLed at each point of a write: nothing duplicated, nothing lost.

Each test starts its own uvicorn process armed to kill itself (SIGKILL, no
clean-up) at one crash point, calls a tool through it, lets the executor's
lease run out, runs the lease sweep + reconciliation as a separate process,
and retries the call through a healthy server.
"""

import time

import pytest
from django.utils import timezone

from idemops_demo.models import Order
from tests.support.issued_ids import labelled_arguments
from tests.support.mcp_client import call_sync
from tests.support.processes import WebServer, downstream_env, manage
from tools_app.models import IdempotencyRecord, RecordStatus

pytestmark = pytest.mark.live

LEASE_SECONDS = 2
HEARTBEAT_SECONDS = 0.5
PAYMENT = {"amount": "10.00", "currency": "EUR", "payee": "Bob", "reference": "crash"}
ORDER = {"customer": "ACME", "items": [{"sku": "A", "quantity": 1, "unit_price": "5.00"}], "currency": "EUR"}


@pytest.fixture
def crashing_server(gateway, sink, transactional_db):
    servers = []

    def start(point):
        server = WebServer(f"web-crash-{point}", IDEMOPS_CRASH_POINTS=point,
                           IDEMOPS_EXECUTION_LEASE_SECONDS=str(LEASE_SECONDS),
                           IDEMOPS_EXECUTION_HEARTBEAT_SECONDS=str(HEARTBEAT_SECONDS), **downstream_env(gateway, sink))
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def call_and_die(server, token, tool, arguments):
    with pytest.raises(Exception):  # noqa: B017 - the connection dies with the process, any client error
        call_sync(server.mcp_url, token, tool, arguments)
    server.process.wait(timeout=10)
    assert server.process.returncode == -9, "the server should have been SIGKILLed at the crash point"


def sweep_after_lease_expiry(env):
    """Wait for every executor lease to run out, then run the periodic job as its own process."""
    deadline = time.monotonic() + 30
    while IdempotencyRecord.objects.filter(status=RecordStatus.PROCESSING,
                                           lease_expires_at__gte=timezone.now()).exists():
        assert time.monotonic() < deadline
        time.sleep(0.2)
    manage("reconcile", env=env)


@pytest.mark.parametrize("point, status_after_sweep, payments_before_retry", [
    ("after_claim", RecordStatus.FAILED, 0),         # nothing was sent: definitely not done
    ("after_downstream", RecordStatus.SUCCEEDED, 1),  # the gateway paid: found by key
    ("after_commit", RecordStatus.SUCCEEDED, 1),      # recorded before the crash: nothing to sweep
])
def test_a_payment_survives_a_crash_at_each_point(crashing_server, web_server, token, downstreams, gateway,
                                                  point, status_after_sweep, payments_before_retry):
    # The operation id is issued by a healthy server (the crashing one would die preparing it).
    arguments = labelled_arguments(web_server.mcp_url, token, "request_payment",
                                   {**PAYMENT, "idempotency_key": f"crash-{point}"})

    call_and_die(crashing_server(point), token, "request_payment", arguments)
    sweep_after_lease_expiry(downstreams)

    record = IdempotencyRecord.objects.get(key=arguments["idempotency_key"])
    assert record.status == status_after_sweep
    assert len(gateway.payments()) == payments_before_retry
    retry = call_sync(web_server.mcp_url, token, "request_payment", arguments)
    assert not retry.is_error
    assert [p[0] for p in gateway.payments()] == [retry.structured_content["payment_id"]]


@pytest.mark.parametrize("point, orders_before_retry", [
    ("after_claim", 0), ("after_downstream", 0), ("after_commit", 1)])
def test_an_order_survives_a_crash_at_each_point(crashing_server, web_server, token, downstreams, point,
                                                 orders_before_retry):
    arguments = {**ORDER, "idempotency_key": f"order-crash-{point}"}

    call_and_die(crashing_server(point), token, "create_order", arguments)
    sweep_after_lease_expiry(downstreams)

    assert Order.objects.count() == orders_before_retry
    retry = call_sync(web_server.mcp_url, token, "create_order", arguments)
    assert not retry.is_error
    assert list(Order.objects.values_list("pk", flat=True)) == [retry.structured_content["order_id"]]


def wait_for_lease_expiry(key: str) -> IdempotencyRecord:
    """Wait until the dead executor's lease ran out: time passing, no sweep running."""
    record = IdempotencyRecord.objects.get(key=key)
    while record.lease_expires_at >= timezone.now():
        time.sleep(0.1)
    return record


def test_a_retry_runs_a_dead_executors_order_at_once_since_nothing_of_it_committed(crashing_server, web_server,
                                                                                   token, downstreams):
    # given a web process SIGKILLed holding a claimed create_order key: a local tool claims inside
    # the transaction of its effect, so the claim died with that transaction
    arguments = {**ORDER, "idempotency_key": "order-no-sweep"}
    call_and_die(crashing_server("after_claim"), token, "create_order", arguments)
    assert not IdempotencyRecord.objects.filter(key="order-no-sweep").exists()

    # when the agent retries (no lease to wait out, no sweep)
    retry = call_sync(web_server.mcp_url, token, "create_order", arguments)

    # then that one call runs the order, exactly once
    assert not retry.is_error
    assert list(Order.objects.values_list("pk", flat=True)) == [retry.structured_content["order_id"]]
    record = IdempotencyRecord.objects.get(key="order-no-sweep")
    assert (record.status, record.attempts) == (RecordStatus.SUCCEEDED, 1)


def test_a_retry_after_the_lease_learns_a_dead_executors_payment_is_being_reconciled_without_any_sweep(
        crashing_server, web_server, token, downstreams, gateway):
    # given a web process SIGKILLed after the gateway paid, before it recorded the payment
    arguments = labelled_arguments(web_server.mcp_url, token, "request_payment",
                                   {**PAYMENT, "idempotency_key": "pay-no-sweep"})
    call_and_die(crashing_server("after_downstream"), token, "request_payment", arguments)
    wait_for_lease_expiry(arguments["idempotency_key"])

    # when the agent retries once the lease ran out
    retry = call_sync(web_server.mcp_url, token, "request_payment", arguments)

    # then it hears at once that the outcome is being reconciled (not in_progress), and the
    # record is due for reconciliation now; reconciliation then finds the one payment
    assert retry.is_error and retry.structured_content["error"]["class"] == "unknown_outcome"
    record = IdempotencyRecord.objects.get(key=arguments["idempotency_key"])
    assert record.status == RecordStatus.UNKNOWN and record.next_reconcile_at <= timezone.now()
    manage("reconcile", env=downstreams)
    replay = call_sync(web_server.mcp_url, token, "request_payment", arguments)
    assert not replay.is_error and replay.structured_content["idempotency"]["replayed"] is True
    assert [p[0] for p in gateway.payments()] == [replay.structured_content["payment_id"]]
