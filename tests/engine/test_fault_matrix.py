"""The fault matrix: each fault caused for real, against real processes, each ending the same way:
one side effect, and every caller told the truth.

A web process (uvicorn) serves /mcp and the payment gateway's signed callbacks; the payment
gateway is its own process with its own database, told to misbehave through its API. No job
cluster runs here: an UNKNOWN payment is settled only by the gateway's callback (or by a
reconciliation the test runs), so "settled at once by the callback" is what the test sees.
"""

from __future__ import annotations

import asyncio
import json
import time

import httpx2
import pytest
from django.db import connection

from idemops_demo.models import Order
from tests.support.agents import call_tool as raw_tool_call
from tests.support.issued_ids import labelled_arguments
from tests.support.mcp_client import call_sync, error_of
from tests.support.processes import PaymentGateway, WebServer, free_port
from tests.support.task_stack import wait_until
from tools_app.models import AuditEvent, IdempotencyRecord, RecordStatus

pytestmark = pytest.mark.live

SECRET = "callback-secret-for-tests"


@pytest.fixture(scope="module")
def stack(django_db_setup, django_db_blocker):
    """A gateway that reports payments to the web process's callback, and that web process."""
    with django_db_blocker.unblock():
        port = free_port()
        gateway = PaymentGateway("gateway-faults", "test_gateway_faults",
                                 callback_url=f"http://127.0.0.1:{port}/callbacks/payment-gateway",
                                 callback_secret=SECRET)
        try:
            web = WebServer("web-faults", port=port, IDEMOPS_PAYMENT_GATEWAY_URL=gateway.url,
                            IDEMOPS_PAYMENT_GATEWAY_TIMEOUT_SECONDS="2",
                            IDEMOPS_PAYMENT_GATEWAY_CALLBACK_SECRET=SECRET,
                            IDEMOPS_FOLLOWER_WAIT_SECONDS="10")
        except BaseException:
            gateway.stop()
            raise
    yield web, gateway
    web.stop()
    gateway.stop()


@pytest.fixture
def web(stack):
    return stack[0]


@pytest.fixture
def gateway(stack):
    stack[1].reset()
    return stack[1]


def payment(web, token, label: str, amount: str = "42.00") -> dict:
    """request_payment's arguments; its key is the operation id issued for `label`, the same one
    every time (tests/support/issued_ids.py)."""
    return labelled_arguments(web.mcp_url, token, "request_payment", {
        "amount": amount, "currency": "EUR", "payee": "ACME Supplies", "idempotency_key": label})


def record_of(web, token, label: str) -> IdempotencyRecord:
    return IdempotencyRecord.objects.get(key=payment(web, token, label)["idempotency_key"], retired_at__isnull=True)


def events_of(record: IdempotencyRecord) -> list[tuple[str, str]]:
    return list(AuditEvent.objects.filter(object_type="idempotencyrecord", object_id=str(record.pk))
                .order_by("id").values_list("action", "actor"))


# --- the gateway fails after it paid ------------------------------------------------------------


@pytest.mark.parametrize("fault", ["succeed-then-fail", "succeed-then-reset", "succeed-then-hang"])
def test_a_payment_the_gateway_made_but_never_confirmed_is_unknown_then_settled_at_once_by_its_callback(
        web, gateway, token, fault):
    # given a gateway that pays, then answers 500 / drops the connection mid-answer / never answers
    gateway.set_fault("*", fault, times=1)

    # when the agent asks for a payment
    first = call_sync(web.mcp_url, token, "request_payment", payment(web, token, f"pay-{fault}"))

    # then it is told the truth: the outcome is unknown (not "failed", not "retry with a new key")
    assert error_of(first)["class"] == "unknown_outcome"
    # and the gateway's signed callback settles the record, with no reconciliation poll running
    record = wait_until(lambda: (r := record_of(web, token, f"pay-{fault}")).status == RecordStatus.SUCCEEDED
                        and r, timeout=60, what="the callback to settle the payment")
    assert ("record.reconciled", "system:payment-gateway-callback") in events_of(record)
    # and the retry with the same key gets the one payment the gateway made
    again = call_sync(web.mcp_url, token, "request_payment", payment(web, token, f"pay-{fault}"))
    assert not again.is_error and again.structured_content["idempotency"]["replayed"]
    [(payment_id, _, _)] = gateway.payments()
    assert again.structured_content["payment_id"] == payment_id


def test_a_slow_gateway_that_answers_in_time_pays_once_for_the_caller_and_every_follower(web, gateway, token):
    # given a gateway that takes 1.5 s to pay (the client waits up to 2 s)
    gateway.set_fault("*", "slow", times=1, seconds=1.5)

    # when the agent and four retries of the same call arrive while it works
    arguments = payment(web, token, "pay-slow")

    async def storm():
        first = asyncio.create_task(_mcp_call(web, token, "request_payment", arguments))
        await asyncio.sleep(0.3)
        retries = [_mcp_call(web, token, "request_payment", arguments) for _ in range(4)]
        return await first, await asyncio.gather(*retries)

    first, retries = asyncio.run(storm())

    # then one payment, the first caller executed it, every retry got that same payment
    [(payment_id, _, _)] = gateway.payments()
    assert not first.is_error and not first.structured_content["idempotency"]["replayed"]
    assert first.structured_content["payment_id"] == payment_id
    for retry in retries:
        assert not retry.is_error, retry.structured_content
        assert retry.structured_content["payment_id"] == payment_id and retry.structured_content["idempotency"][
            "replayed"]


def test_a_gateway_slower_than_the_timeout_pays_after_the_caller_gave_up_and_the_callback_settles_it(
        web, gateway, token):
    # given a gateway that pays only after 4 s, twice the client's timeout
    gateway.set_fault("*", "slow", times=1, seconds=4)

    # when the agent asks
    first = call_sync(web.mcp_url, token, "request_payment", payment(web, token, "pay-late"))

    # then it hears "unknown" (nothing paid yet, but the request is on its way) ...
    assert error_of(first)["class"] == "unknown_outcome"
    assert gateway.payments() == []
    # ... and once the gateway pays, its callback settles the record: the retry gets that payment
    wait_until(lambda: record_of(web, token, "pay-late").status == RecordStatus.SUCCEEDED, timeout=60,
               what="the late payment's callback")
    again = call_sync(web.mcp_url, token, "request_payment", payment(web, token, "pay-late"))
    [(payment_id, _, _)] = gateway.payments()
    assert not again.is_error and again.structured_content["payment_id"] == payment_id


# --- callbacks ------------------------------------------------------------------------------------


def test_a_late_duplicate_callback_changes_nothing(web, gateway, token):
    # given a payment settled by its callback after the gateway failed to answer
    gateway.set_fault("*", "succeed-then-fail", times=1)
    call_sync(web.mcp_url, token, "request_payment", payment(web, token, "pay-dup"))
    wait_until(lambda: record_of(web, token, "pay-dup").status == RecordStatus.SUCCEEDED, timeout=60,
               what="the callback")
    record = record_of(web, token, "pay-dup")
    before = (events_of(record), record.result, record.finished_at)
    [(payment_id, _, _)] = gateway.payments()

    # when the gateway sends its callback again, late
    status = gateway.resend_callback(payment_id)

    # then it is acknowledged and nothing moves: no new audit event, the same result
    assert status == 200
    record.refresh_from_db()
    assert (events_of(record), record.result, record.finished_at) == before
    assert len(gateway.payments()) == 1


def test_a_callback_for_a_payment_that_answered_normally_changes_nothing(web, gateway, token):
    paid = call_sync(web.mcp_url, token, "request_payment", payment(web, token, "pay-ok"))
    record = record_of(web, token, "pay-ok")
    before = events_of(record)

    assert gateway.resend_callback(paid.structured_content["payment_id"]) == 200

    assert events_of(record_of(web, token, "pay-ok")) == before == [("record.claimed", before[0][1]),
                                                        ("record.succeeded", before[1][1])]


def test_a_callback_without_the_right_signature_is_refused_and_settles_nothing(web, gateway, token):
    # given an UNKNOWN payment (the gateway never answered, and never paid: no callback of its own)
    gateway.set_fault("*", "hang", times=1)
    call_sync(web.mcp_url, token, "request_payment", payment(web, token, "pay-forged"))
    record = record_of(web, token, "pay-forged")
    assert record.status == RecordStatus.UNKNOWN
    body = json.dumps({"event": "payment.succeeded", "idempotency_key": record.downstream_key, "payment": {
        "payment_id": "pay_forged", "status": "succeeded", "amount": "42.00", "currency": "EUR",
        "payee": "ACME Supplies", "reference": "", "created_at": "2026-01-01T00:00:00+00:00"}}).encode()
    url = f"{web.base_url}/callbacks/payment-gateway"

    # when someone posts a callback for it without a signature, with a wrong one, with another secret's
    answers = [httpx2.post(url, content=body, headers=headers, timeout=10).status_code for headers in (
        {}, {"Gateway-Signature": "t=1,v1=00"}, {"Gateway-Signature": _sign("not-the-secret", body)})]

    # then every one is refused and the record stays UNKNOWN, its evidence untouched
    assert answers == [403, 403, 403]
    assert record_of(web, token, "pay-forged").status == RecordStatus.UNKNOWN
    assert events_of(record_of(web, token, "pay-forged")) == events_of(record)
    # while the same body signed with the shared secret is taken
    assert httpx2.post(url, content=body, headers={"Gateway-Signature": _sign(SECRET, body)},
                       timeout=10).status_code == 200
    assert record_of(web, token, "pay-forged").status == RecordStatus.SUCCEEDED


def _sign(secret: str, body: bytes) -> str:
    from idemops_demo.downstream.payment_gateway import sign

    return sign(secret, body)


# --- the caller goes away ---------------------------------------------------------------------------


def test_a_client_that_disconnects_mid_payment_leaves_one_payment_and_its_retry_gets_it(web, gateway, token):
    # given a gateway that takes 1.5 s to pay
    gateway.set_fault("*", "slow", times=1, seconds=1.5)

    # when the agent's connection drops 0.3 s into the call
    arguments = payment(web, token, "pay-gone")

    async def hang_up():
        async with httpx2.AsyncClient(timeout=30) as client:
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.3):
                    await raw_tool_call(client, web.mcp_url, token, "request_payment", arguments)

    asyncio.run(hang_up())

    # then the server still finishes the call (or records it UNKNOWN): one payment either way
    wait_until(lambda: record_of(web, token, "pay-gone").status != RecordStatus.PROCESSING, timeout=30,
               what="the abandoned call to finish")
    wait_until(lambda: len(gateway.payments()) == 1, timeout=30, what="the payment")
    # and the retry with the same key answers with that payment
    again = wait_until(lambda: _settled_call(web, token, arguments), timeout=60, what="the retry")
    [(payment_id, _, _)] = gateway.payments()
    assert again.structured_content["payment_id"] == payment_id


def _settled_call(web, token, arguments):
    """The call's answer once it has its outcome (the callback settles an unknown one)."""
    result = call_sync(web.mcp_url, token, "request_payment", arguments)
    if result.is_error:
        assert error_of(result)["class"] in ("unknown_outcome", "in_progress"), result.structured_content
        return None
    return result


# --- the database refuses the outcome after the side effect ---------------------------------------------


@pytest.fixture
def refuse_success_once(transactional_db):
    """A trigger that makes the database roll back the statement recording a key's success, once
    (as a serialization failure would): `refuse(key)` arms it. Once: a sequence counts the
    refusals, and a sequence is not rolled back with the statement it failed."""
    with connection.cursor() as cursor:
        cursor.execute("""
            CREATE TABLE fault_refuse_success (key text PRIMARY KEY);
            CREATE SEQUENCE fault_refusals;
            CREATE FUNCTION fault_refuse_success() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF NEW.status = 'succeeded' AND OLD.status = 'processing'
                   AND EXISTS (SELECT FROM fault_refuse_success WHERE key = NEW.key)
                   AND nextval('fault_refusals') = 1 THEN
                    RAISE EXCEPTION 'could not serialize access (injected)' USING ERRCODE = 'serialization_failure';
                END IF;
                RETURN NEW;
            END $$;
            CREATE TRIGGER fault_refuse_success BEFORE UPDATE ON tools_app_idempotencyrecord
                FOR EACH ROW EXECUTE FUNCTION fault_refuse_success();
        """)

    def refuse(key: str) -> None:
        with connection.cursor() as cursor:
            cursor.execute("INSERT INTO fault_refuse_success (key) VALUES (%s)", [key])

    yield refuse
    with connection.cursor() as cursor:
        cursor.execute("DROP TRIGGER fault_refuse_success ON tools_app_idempotencyrecord; "
                       "DROP FUNCTION fault_refuse_success(); DROP TABLE fault_refuse_success; "
                       "DROP SEQUENCE fault_refusals;")


def test_a_payment_whose_success_the_database_rolls_back_is_unknown_then_settled_never_paid_twice(
        web, gateway, token, refuse_success_once):
    # given the database will roll back the statement that records this payment's success
    refuse_success_once(payment(web, token, "pay-rollback")["idempotency_key"])

    # when the agent pays: the gateway pays, then recording it fails
    first = call_sync(web.mcp_url, token, "request_payment", payment(web, token, "pay-rollback"))

    # then the agent hears "unknown", not "failed" (the money moved) ...
    assert error_of(first)["class"] == "unknown_outcome"
    # ... the callback settles it, and the retry gets the one payment
    wait_until(lambda: record_of(web, token, "pay-rollback").status == RecordStatus.SUCCEEDED, timeout=60,
               what="the callback")
    again = call_sync(web.mcp_url, token, "request_payment", payment(web, token, "pay-rollback"))
    [(payment_id, _, _)] = gateway.payments()
    assert not again.is_error and again.structured_content["payment_id"] == payment_id


def test_an_order_whose_success_the_database_rolls_back_is_retried_and_made_once(web, token, refuse_success_once):
    order = {"customer": "ACME", "currency": "EUR", "idempotency_key": "order-rollback",
             "items": [{"sku": "BOLT-1", "quantity": 3, "unit_price": "2.50"}]}
    refuse_success_once("order-rollback")

    # when the order and its record commit together, and that commit is rolled back
    first = call_sync(web.mcp_url, token, "create_order", order)

    # then nothing was made and the agent is told to retry with the same key
    error = error_of(first)
    assert error["class"] == "transient" and "nothing was committed" in error["message"]
    assert Order.objects.count() == 0
    # and the retry with the same key, after retry_after, makes the order once
    time.sleep(error["retry_after"])
    again = call_sync(web.mcp_url, token, "create_order", order)
    assert not again.is_error, again.structured_content
    assert Order.objects.count() == 1 and again.structured_content["order_id"] == Order.objects.get().pk


async def _mcp_call(web, token, tool, arguments):
    from tests.support.mcp_client import call

    return await call(web.mcp_url, token, tool, arguments)
