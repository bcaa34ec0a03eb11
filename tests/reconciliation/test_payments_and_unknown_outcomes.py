"""request_payment against a real gateway process that misbehaves on request."""

from datetime import timedelta

import httpx2
import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from tests.support.issued_ids import call_labelled, call_labelled_sync
from tests.support.mcp_client import error_of
from tests.support.operators import make_operator
from tests.support.processes import manage
from tests.support.task_stack import wait_until
from tools_app.access.roles import OPERATOR
from tools_app.conf import override_conf
from tools_app.core import backoff, clock
from tools_app.core.errors import Transient
from tools_app.core.jobs import JOBS
from tools_app.engine import evidence_entry, resolve_failed
from tools_app.metrics import dashboard
from tools_app.models import AuditEvent, IdempotencyRecord, RecordStatus

pytestmark = pytest.mark.live

PAYMENT = {"amount": "42.50", "currency": "EUR", "payee": "ACME Supplies", "reference": "INV-7"}


def pay(web_server, token, label, **overrides):
    """A payment named by `label` (the key it carries is the operation id issued for it:
    tests/support/issued_ids.py)."""
    return call_labelled_sync(web_server.mcp_url, token, "request_payment",
                              {**PAYMENT, **overrides, "idempotency_key": label})


def payment_record() -> IdempotencyRecord:
    """The test's one payment operation."""
    return IdempotencyRecord.objects.get(tool="request_payment")


@pytest.mark.parametrize("amount", ["Infinity", "NaN", "0", "1.005"])
def test_the_gateway_refuses_an_amount_that_is_not_a_positive_sum_of_cents_saying_so(gateway, amount):
    # when: a request with such an amount reaches the gateway
    response = httpx2.post(f"{gateway.url}/payments", json={**PAYMENT, "amount": amount},
                           headers={"Idempotency-Key": f"bad-amount-{amount}"}, timeout=10)

    # then: refused for what it is, and nothing paid
    assert (response.status_code, response.json()) == (
        422, {"error": "amount must be positive with at most 2 decimals"})
    assert gateway.payments() == []


def test_a_payment_is_made_once_and_replayed(web_server, token, downstreams, gateway):
    first = pay(web_server, token, "p-1")
    again = pay(web_server, token, "p-1")

    assert not first.is_error
    assert again.structured_content["payment_id"] == first.structured_content["payment_id"]
    assert again.structured_content["idempotency"]["replayed"] is True
    assert [p[0] for p in gateway.payments()] == [first.structured_content["payment_id"]]


def test_an_answer_that_never_arrives_is_unknown_then_reconciled_to_the_one_payment(
        web_server, token, downstreams, gateway):
    # given: the gateway commits the payment, then never answers
    gateway.set_fault("*", "succeed-then-hang", times=1)

    # when
    first = pay(web_server, token, "p-hang")
    retry = pay(web_server, token, "p-hang")

    # then: nobody guessed
    assert error_of(first)["class"] == "unknown_outcome"
    assert error_of(retry)["class"] == "unknown_outcome"
    record = payment_record()
    assert record.status == RecordStatus.UNKNOWN
    assert record.evidence[-1]["error"] == "ReadTimeout"
    assert len(gateway.payments()) == 1

    # when: reconciliation runs (what the django-q2 schedule runs)
    manage("reconcile", env=downstreams)

    # then: the record holds the gateway's payment, and a retry returns it
    record.refresh_from_db()
    payment_id, key, _ = gateway.payments()[0]
    assert (record.status, record.result["payment_id"], key) == (RecordStatus.SUCCEEDED, payment_id,
                                                                  record.downstream_key)
    assert record.evidence[-1]["source"] == "reconciler" and record.evidence[-1]["answer"]["status"] == 200
    replay = pay(web_server, token, "p-hang")
    assert replay.structured_content["payment_id"] == payment_id
    assert replay.structured_content["idempotency"]["replayed"] is True
    assert len(gateway.payments()) == 1
    assert AuditEvent.objects.filter(object_id=str(record.pk), action="record.reconciled").exists()


def test_a_request_that_hangs_before_paying_is_reconciled_as_not_done_and_may_run_again(
        web_server, token, downstreams, gateway):
    gateway.set_fault("*", "hang", times=1)

    assert error_of(pay(web_server, token, "p-stuck"))["class"] == "unknown_outcome"
    manage("reconcile", env=downstreams)

    record = payment_record()
    assert (record.status, record.error_class) == (RecordStatus.FAILED, "transient")
    again = pay(web_server, token, "p-stuck")
    assert not again.is_error
    assert len(gateway.payments()) == 1


def test_a_500_from_the_gateway_is_reconciled_not_guessed(web_server, token, downstreams, gateway):
    gateway.set_fault("*", "fail", times=1)

    assert error_of(pay(web_server, token, "p-500"))["class"] == "unknown_outcome"
    assert payment_record().status == RecordStatus.UNKNOWN
    manage("reconcile", env=downstreams)

    assert not pay(web_server, token, "p-500").is_error
    assert len(gateway.payments()) == 1


def test_429_is_transient_with_retry_after_and_the_retry_pays_once(web_server, token, downstreams, gateway):
    gateway.set_fault("*", "ratelimit", times=1)

    first = error_of(pay(web_server, token, "p-429"))
    # The gateway's second is held open by the database's clock: a slow machine could take longer
    # than that between two calls, and the retry "too soon" would be made in time.
    IdempotencyRecord.objects.update(retry_not_before=clock.later(60))
    too_soon = error_of(pay(web_server, token, "p-429"))
    IdempotencyRecord.objects.update(retry_not_before=clock.NOW)  # the wait is over
    later = pay(web_server, token, "p-429")

    assert first["class"] == "transient" and first["retry_after"] == 1
    assert too_soon["class"] == "transient" and 1 < too_soon["retry_after"] <= 60
    assert not later.is_error
    assert len(gateway.payments()) == 1
    assert payment_record().attempts == 2


def test_an_absurd_retry_after_from_the_gateway_is_bounded_and_the_answer_keeps_its_class(
        web_server, token, downstreams, gateway):
    # given a gateway that asks for a wait of three million years
    gateway.set_fault("*", "unavailable-for-ages", times=1)

    first = error_of(pay(web_server, token, "p-ages"))

    # then: a classified answer with a usable wait, no payment, and the record keeps the same bound
    assert first["class"] == "transient" and first["retry_after"] == 3600
    assert gateway.payments() == []
    record = payment_record()
    assert (record.status, record.error_class) == (RecordStatus.FAILED, "transient")
    assert record.retry_not_before <= record.finished_at + timedelta(seconds=3600)


@pytest.mark.parametrize(("header", "seconds"), [
    ("2", 2.0), ("0.5", 0.5), ("-3", 0.0), ("99999999999999", 3600.0), ("inf", 3600.0), ("1e400", 3600.0),
    ("nan", None), ("Wed, 21 Oct 2026 07:28:00 GMT", None), ("", None), (None, None),
])
def test_a_retry_after_header_is_read_as_bounded_seconds_or_not_at_all(header, seconds):
    assert backoff.retry_after_header(header) == seconds


def test_a_rejection_from_the_gateway_is_deterministic_and_replayed(web_server, token, downstreams, gateway):
    gateway.set_fault("*", "reject", times=1)

    first = error_of(pay(web_server, token, "p-422"))
    again = error_of(pay(web_server, token, "p-422"))

    assert first["class"] == again["class"] == "invalid_input"
    assert first["message"] == again["message"]
    assert gateway.payments() == []
    record = payment_record()
    assert (record.status, record.attempts) == (RecordStatus.FAILED, 1)
    assert record.evidence[-1]["answer"]["status"] == 422


def test_an_unreachable_gateway_is_transient(web_server, token, downstreams, gateway, settings):
    from tests.support.processes import free_port
    from tools_app.models import Tenant
    from tools_app.toolkit.calls import Caller

    override_conf(settings, payment_gateway_url=f"http://127.0.0.1:{free_port()}")
    caller = Caller(tenant_id=Tenant.objects.get().pk, actor="agent:acme/test")

    result = call_labelled(caller, "request_payment", {**PAYMENT, "idempotency_key": "p-refused"})

    assert result.error.error_class == "transient" and result.error.retry_after > 0
    assert result.record.status == RecordStatus.FAILED


def test_the_same_key_for_another_payee_is_a_conflict_and_pays_nothing_more(web_server, token, downstreams, gateway):
    pay(web_server, token, "p-2")

    error = error_of(pay(web_server, token, "p-2", payee="Someone Else"))

    assert error["class"] == "conflict" and error["differing_fields"] == ["payee"]
    assert len(gateway.payments()) == 1


def test_a_key_the_gateway_holds_for_another_request_is_a_downstream_conflict_for_an_operator(
        web_server, token, downstreams, gateway):
    # given: the gateway answers 409 "key already used with another request" (as when its store holds the
    # forwarded key for something else); the forwarded key is per operation, so the fault is armed for any key
    gateway.set_fault("*", "conflict", times=1)

    # when the agent pays, and retries with the same key
    first = error_of(pay(web_server, token, "p-409"))
    again = error_of(pay(web_server, token, "p-409"))

    # then: its own class, no differing_fields (nothing differed here), advice for an operator; nothing paid
    assert first["class"] == again["class"] == "downstream_conflict"
    assert "differing_fields" not in first
    assert "operator must check" in first["message"] and "do not just use a new key" in first["message"]
    assert gateway.payments() == []
    record = payment_record()
    assert (record.status, record.error_class, record.attempts) == (RecordStatus.FAILED, "downstream_conflict", 1)
    assert record.evidence[-1]["answer"]["status"] == 409


def test_reconciliation_that_keeps_failing_escalates_to_a_person(web_server, token, downstreams, gateway, settings):
    from tests.support.processes import free_port
    from tools_app import reconciliation

    gateway.set_fault("*", "hang", times=1)
    pay(web_server, token, "p-lost")
    override_conf(settings, payment_gateway_url=f"http://127.0.0.1:{free_port()}", reconcile_max_attempts=2)
    record = payment_record()

    assert reconciliation.reconcile(record, make_operator("olga", OPERATOR, record.tenant)) == "unknown"
    record.refresh_from_db()
    assert record.escalated_at is None and record.next_reconcile_at is not None
    IdempotencyRecord.objects.filter(pk=record.pk).update(next_reconcile_at=timezone.now())
    assert reconciliation.reconcile_due() == {"succeeded": 0, "failed": 0, "unknown": 1}
    record.refresh_from_db()
    assert record.escalated_at is not None and record.next_reconcile_at is None
    assert record.reconcile_attempts == 2
    assert AuditEvent.objects.filter(object_id=str(record.pk), action="record.escalated").exists()


@pytest.mark.django_db
def test_the_periodic_jobs_are_scheduled_after_migrate():
    from django_q.models import Schedule

    funcs = set(Schedule.objects.values_list("func", flat=True))

    assert {JOBS["reconciliation.run_periodic"], JOBS["outbox.relay"]} <= funcs


@pytest.mark.django_db
def test_a_payment_above_the_threshold_waits_for_a_person_then_pays_once(downstreams, gateway):
    from tests.support.jobs import run_queued_jobs
    from tests.support.operators import make_operator
    from tools_app import access, approvals
    from tools_app.access.roles import APPROVER
    from tools_app.models import ApprovalRequest, ApprovalSettings
    from tools_app.toolkit.calls import Caller

    # given: payments above 100 EUR need one approval
    tenant = access.create_tenant("acme")
    ApprovalSettings.objects.create(tenant=tenant, payment_threshold=100)
    caller = Caller(tenant.pk, "agent:acme/bot")
    big, small = {**PAYMENT, "amount": "250.00"}, {**PAYMENT, "amount": "20.00"}

    # when
    asked = call_labelled(caller, "request_payment", {**big, "idempotency_key": "big"})
    paid_at_once = call_labelled(caller, "request_payment", {**small, "idempotency_key": "small"})

    # then: the big one waits, with what the operator will read; the small one is paid
    assert asked.error.error_class == "pending_approval"
    request = ApprovalRequest.objects.get()
    assert request.summary == "Pay 250.00 EUR to ACME Supplies (reference INV-7)" and request.amount == 250
    assert paid_at_once.error is None and len(gateway.payments()) == 1

    # when: a person approves, and the job runs (twice: a redelivery)
    approvals.approve(request, make_operator("bob", APPROVER, tenant), reason="invoice checked")
    run_queued_jobs()
    run_queued_jobs()

    # then: one more payment, and the agent's retry returns it
    retry = call_labelled(caller, "request_payment", {**big, "idempotency_key": "big"})
    assert retry.error is None and retry.replayed
    assert len(gateway.payments()) == 2
    assert retry.result["payment_id"] in [p[0] for p in gateway.payments()]


def test_a_retry_the_gateway_recognises_counts_as_a_downstream_duplicate(web_server, token, downstreams, gateway):
    # given: the gateway pays, but its answer is lost (UNKNOWN), and an operator says "not done" by mistake
    gateway.set_fault("*", "succeed-then-hang", times=1)
    pay(web_server, token, "p-dup")
    record = payment_record()
    resolve_failed(record, Transient("operator error", retry_after=0), actor="user:ops", reason="mistake",
                   evidence=evidence_entry("operator"))

    # when: the agent retries with the same key
    retry = pay(web_server, token, "p-dup")

    # then: the gateway answered from its idempotency store: still one payment, and the evidence says so
    assert not retry.is_error and len(gateway.payments()) == 1
    record.refresh_from_db()
    assert record.evidence[-1]["answer"] == {"status": 200, "deduplicated": True}
    # and the dashboard counts it once the web process has written its counts (about once a second)
    root = User.objects.create_superuser("root")
    counted = wait_until(lambda: [s for s in dashboard.snapshot(root).tools
                                  if s.tool == "request_payment" and s.downstream_duplicates],
                         timeout=30, what="the duplicate's count")
    assert counted[0].downstream_duplicates == 1
