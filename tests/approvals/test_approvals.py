"""Approvals against real PostgreSQL: divert, follow, decide, expire (races: test_approvals_exactly_once.py)."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone
from django_q.models import OrmQ, Schedule

from idemops_demo.models import Announcement, Order, Ticket
from tests.support.approvals_support import STAFF_NOTE, actions, call, pending_request
from tests.support.jobs import queued_jobs, run_queued_jobs
from tests.support.operators import make_operator
from tools_app import approvals, engine
from tools_app.access.roles import APPROVER, OPERATOR
from tools_app.core.errors import Refused
from tools_app.core.jobs import JOBS
from tools_app.models import (
    ApprovalRequest,
    ApprovalSettings,
    ApprovalStatus,
    AuditEvent,
    IdempotencyRecord,
    RecordStatus,
)
from tools_app.toolkit.calls import Caller

# --- asking --------------------------------------------------------------------------


def test_a_sensitive_call_runs_nothing_and_answers_pending_approval(caller):
    result = call(caller, "publish_announcement", idempotency_key="a-1", **STAFF_NOTE)

    request = pending_request(result)
    approval = result.error.as_dict()["approval"]
    assert approval == {"request_id": request.pk, "status": "pending", "summary": request.summary,
                        "expires_at": request.expires_at.isoformat(), "approvals_required": 1, "approvals_given": 0}
    assert "Maintenance" in request.summary and "staff" in request.summary
    assert result.error.retry_after > 0 and not result.replayed
    assert Announcement.objects.count() == 0
    assert result.record.status == RecordStatus.AWAITING_APPROVAL and result.record.lease_owner == ""
    assert (request.record_id, request.fingerprint) == (result.record.pk, result.record.fingerprint)
    assert request.requested_by == "agent:acme/test"
    assert actions(object_type="approvalrequest") == ["approval.requested"]
    assert "record.awaiting_approval" in actions(object_type="idempotencyrecord")


def test_the_same_key_and_arguments_get_the_same_request(caller):
    first = call(caller, "publish_announcement", idempotency_key="a-1", **STAFF_NOTE)
    again = call(caller, "publish_announcement", idempotency_key="a-1", **STAFF_NOTE, trace_id="other-trace")

    assert pending_request(again).pk == pending_request(first).pk
    assert again.replayed
    assert ApprovalRequest.objects.count() == 1
    assert IdempotencyRecord.objects.filter(tool="publish_announcement").count() == 1


def test_other_arguments_with_the_same_key_are_a_conflict(caller):
    call(caller, "publish_announcement", idempotency_key="a-1", **STAFF_NOTE)

    result = call(caller, "publish_announcement", idempotency_key="a-1", **{**STAFF_NOTE, "body": "Down at 3am"})

    assert result.error.error_class == "conflict" and result.error.differing_fields == ["body"]
    assert ApprovalRequest.objects.count() == 1


def test_deleting_something_that_does_not_exist_fails_before_anyone_is_asked(caller):
    result = call(caller, "delete_record", idempotency_key="d-1", kind="order", id=999, reason="cleanup")

    assert result.error.error_class == "not_found"
    assert ApprovalRequest.objects.count() == 0
    assert IdempotencyRecord.objects.get(tool="delete_record").status == RecordStatus.FAILED


def test_a_tool_without_an_approval_rule_runs_at_once(caller):
    result = call(caller, "create_ticket", idempotency_key="t-1", subject="Printer", body="Jammed")

    assert result.error is None and ApprovalRequest.objects.count() == 0


# --- deciding ----------------------------------------------------------------------------


def test_an_approved_call_runs_once_in_a_job_and_a_retry_returns_its_result(caller, approver):
    request = pending_request(call(caller, "publish_announcement", idempotency_key="a-1", **STAFF_NOTE))

    approvals.approve(request, approver, reason="looks right")
    # then: nothing ran in the deciding request itself; a job is queued
    assert Announcement.objects.count() == 0
    assert [job["func"] for job in queued_jobs()] == [JOBS["approvals.run_approved"]]
    during = call(caller, "publish_announcement", idempotency_key="a-1", **STAFF_NOTE)
    assert during.error.error_class == "pending_approval"
    assert during.error.as_dict()["approval"]["status"] == "approved"

    run_queued_jobs()
    result = call(caller, "publish_announcement", idempotency_key="a-1", **STAFF_NOTE)

    announcement = Announcement.objects.get()
    assert result.error is None and result.replayed
    assert result.result["announcement_id"] == announcement.pk and announcement.record_id == request.record_id
    request.refresh_from_db()
    assert (request.status, request.decided_by, request.approvals) == (ApprovalStatus.EXECUTED, "user:bob", 1)
    assert actions(object_type="approvalrequest") == ["approval.requested", "approval.approved", "approval.executed"]
    assert AuditEvent.objects.get(action="approval.approved").reason == "looks right"


def test_an_approved_deletion_deletes_the_order_once(caller, approver):
    order = call(caller, "create_order", idempotency_key="o-1", customer="ACME", currency="EUR",
                 items=[{"sku": "A", "quantity": 2, "unit_price": "5.25"}]).result
    args = {"kind": "order", "id": order["order_id"], "reason": "duplicate"}
    request = pending_request(call(caller, "delete_record", idempotency_key="d-1", **args))
    assert request.summary == f"Delete order #{order['order_id']} of ACME, 10.50 EUR, 1 line. Reason: duplicate"

    approvals.approve(request, approver)
    run_queued_jobs()
    retry = call(caller, "delete_record", idempotency_key="d-1", **args)

    assert not Order.objects.filter(pk=order["order_id"]).exists()
    assert retry.replayed and retry.result == {"kind": "order", "id": order["order_id"], "deleted": True,
                                               "description": f"order #{order['order_id']} of ACME, 10.50 EUR, 1 line"}
    assert ApprovalRequest.objects.get().status == ApprovalStatus.EXECUTED


def test_an_approved_deletion_of_something_deleted_meanwhile_fails_without_harm(caller, approver, tenant):
    ticket = call(caller, "create_ticket", idempotency_key="t-1", subject="Printer", body="Jammed").result
    args = {"kind": "ticket", "id": ticket["ticket_id"], "reason": "spam"}
    request = pending_request(call(caller, "delete_record", idempotency_key="d-1", **args))
    Ticket.objects.filter(pk=ticket["ticket_id"]).delete()

    approvals.approve(request, approver)
    run_queued_jobs()
    retry = call(caller, "delete_record", idempotency_key="d-1", **args)

    assert retry.error.error_class == "not_found"
    assert ApprovalRequest.objects.get().status == ApprovalStatus.FAILED


def test_the_status_tool_reports_the_outcome(caller, approver):
    request = pending_request(call(caller, "publish_announcement", idempotency_key="a-1", **STAFF_NOTE))
    pending = call(caller, "get_approval_status", request_id=request.pk)
    approvals.approve(request, approver)
    run_queued_jobs()

    done = call(caller, "get_approval_status", request_id=request.pk)

    assert pending.result["status"] == "pending" and pending.result["result"] is None
    assert done.result["status"] == "executed"
    assert done.result["result"]["announcement_id"] == Announcement.objects.get().pk


def test_the_status_tool_does_not_show_another_tenants_request(caller, other_tenant):
    request = pending_request(call(caller, "publish_announcement", idempotency_key="a-1", **STAFF_NOTE))

    result = call(Caller(tenant_id=other_tenant.pk, actor="agent:globex/x"), "get_approval_status",
                  request_id=request.pk)

    assert result.error.error_class == "not_found"


def test_a_rejection_needs_a_reason_and_then_fails_the_call_for_good(caller, approver, tenant):
    order = call(caller, "create_order", idempotency_key="o-1", customer="ACME", currency="EUR",
                 items=[{"sku": "A", "quantity": 1, "unit_price": "5"}]).result
    args = {"kind": "order", "id": order["order_id"], "reason": "duplicate"}
    request = pending_request(call(caller, "delete_record", idempotency_key="d-1", **args))

    with pytest.raises(Refused, match="needs a reason"):
        approvals.reject(request, approver, reason="  ")
    approvals.reject(request, approver, reason="the customer still needs it")
    retry = call(caller, "delete_record", idempotency_key="d-1", **args)

    assert retry.error.error_class == "permission_denied"
    assert "the customer still needs it" in retry.error.message and retry.replayed
    assert Order.objects.filter(pk=order["order_id"]).exists()
    request.refresh_from_db()
    assert request.status == ApprovalStatus.REJECTED and request.reason == "the customer still needs it"
    assert queued_jobs() == []
    assert actions(object_type="approvalrequest") == ["approval.requested", "approval.refused", "approval.rejected"]


def test_an_unanswered_request_expires_on_the_sweep(caller):
    request = pending_request(call(caller, "publish_announcement", idempotency_key="a-1", **STAFF_NOTE))
    ApprovalRequest.objects.filter(pk=request.pk).update(expires_at=timezone.now() - timedelta(seconds=1))

    swept = approvals.sweep()
    retry = call(caller, "publish_announcement", idempotency_key="a-1", **STAFF_NOTE)

    assert swept["expired"] == 1
    assert retry.error.error_class == "permission_denied" and "expired" in retry.error.message
    request.refresh_from_db()
    assert request.status == ApprovalStatus.EXPIRED
    assert Announcement.objects.count() == 0
    assert AuditEvent.objects.get(action="approval.expired").actor == "system:approval-sweep"


def test_an_expired_request_can_no_longer_be_approved(caller, approver):
    request = pending_request(call(caller, "publish_announcement", idempotency_key="a-1", **STAFF_NOTE))
    ApprovalRequest.objects.filter(pk=request.pk).update(expires_at=timezone.now() - timedelta(seconds=1))

    with pytest.raises(Refused, match="expired"):
        approvals.approve(request, approver)
    assert queued_jobs() == []


def test_the_sweep_and_the_seal_are_periodic_jobs(db):
    assert set(Schedule.objects.values_list("name", "func")) >= {
        ("approvals.sweep", JOBS["approvals.sweep"]), ("audit.seal", JOBS["audit.seal"])}


# --- who may decide ---------------------------------------------------------------------


def test_the_requester_cannot_approve_its_own_request_and_the_attempt_is_audited(tenant):
    alice = make_operator("alice", APPROVER, tenant)
    as_alice = Caller(tenant_id=tenant.pk, actor="user:alice")
    request = pending_request(call(as_alice, "publish_announcement", idempotency_key="a-1", **STAFF_NOTE))

    with pytest.raises(Refused, match="self-approval"):
        approvals.approve(request, alice)

    request.refresh_from_db()
    assert (request.status, request.approvals) == (ApprovalStatus.PENDING, 0)
    refusal = AuditEvent.objects.get(action="approval.refused")
    assert (refusal.actor, refusal.tenant_id, refusal.object_id) == ("user:alice", tenant.pk, str(request.pk))
    assert "self-approval" in refusal.reason and refusal.after == {"attempted": "approve"}
    assert refusal.trace_id == request.trace_id != ""


def test_a_user_without_the_approve_permission_is_refused_and_audited(caller, tenant):
    operator = make_operator("olga", OPERATOR, tenant)
    request = pending_request(call(caller, "publish_announcement", idempotency_key="a-1", **STAFF_NOTE))

    with pytest.raises(Refused, match="missing permission"):
        approvals.approve(request, operator)
    with pytest.raises(Refused, match="missing permission"):
        approvals.reject(request, operator, reason="no")

    assert ApprovalRequest.objects.get().status == ApprovalStatus.PENDING
    assert list(AuditEvent.objects.filter(action="approval.refused").values_list("actor", "after")) == [
        ("user:olga", {"attempted": "approve"}), ("user:olga", {"attempted": "reject"})]


def test_an_approver_of_another_tenant_is_refused(caller, other_tenant):
    stranger = make_operator("gus", APPROVER, other_tenant)
    request = pending_request(call(caller, "publish_announcement", idempotency_key="a-1", **STAFF_NOTE))

    with pytest.raises(Refused, match="tenant you may not see"):
        approvals.approve(request, stranger)
    assert ApprovalRequest.objects.get().status == ApprovalStatus.PENDING


def test_publishing_to_everyone_takes_two_different_people(caller, approver, second_approver):
    request = pending_request(call(caller, "publish_announcement", idempotency_key="a-1",
                                   **{**STAFF_NOTE, "audience": "everyone"}))
    assert request.required_approvals == 2

    assert approvals.approve(request, approver).status == ApprovalStatus.PENDING
    with pytest.raises(Refused, match="already decided"):
        approvals.approve(request, approver)
    assert queued_jobs() == []
    assert approvals.approve(request, second_approver).status == ApprovalStatus.APPROVED

    run_queued_jobs()
    assert Announcement.objects.get().audience == "everyone"
    assert actions(object_type="approvalrequest") == [
        "approval.requested", "approval.approval_counted", "approval.refused", "approval.approved",
        "approval.executed"]


def test_an_approval_whose_job_was_lost_is_queued_again_by_the_sweep(caller, approver):
    request = pending_request(call(caller, "publish_announcement", idempotency_key="a-1", **STAFF_NOTE))
    approvals.approve(request, approver)
    OrmQ.objects.all().delete()  # the job failed for good (django-q2 does not retry it)

    assert approvals.sweep()["redriven"] == 0  # too soon: its job may still be on the way
    ApprovalRequest.objects.update(dispatched_at=timezone.now() - approvals.REDRIVE_AFTER)
    assert approvals.sweep()["redriven"] == 1
    assert approvals.sweep()["redriven"] == 0  # once per stall
    run_queued_jobs()

    assert Announcement.objects.count() == 1
    assert ApprovalRequest.objects.get().status == ApprovalStatus.EXECUTED
    assert AuditEvent.objects.filter(action="approval.redriven").count() == 1


def test_the_sweep_settles_a_request_whose_job_died_after_running_it(caller, approver):
    request = pending_request(call(caller, "publish_announcement", idempotency_key="a-1", **STAFF_NOTE))
    approvals.approve(request, approver)
    # the job ran the operation and died before settling the request
    operation, execute = approvals.approved_operation(request)
    engine.execute_approved(request.record, operation, execute)
    assert ApprovalRequest.objects.get().status == ApprovalStatus.APPROVED

    assert approvals.sweep()["settled"] == 1
    assert ApprovalRequest.objects.get().status == ApprovalStatus.EXECUTED
    run_queued_jobs()  # the original job, delivered late: nothing more happens
    assert Announcement.objects.count() == 1


# --- policies --------------------------------------------------------------------------------


@pytest.mark.parametrize(("amount", "currency", "needed"), [
    ("100.00", "EUR", None), ("100.01", "EUR", 1), ("1000.00", "EUR", 1), ("1000.01", "EUR", 2), ("5.00", "USD", 2),
])
def test_the_payment_policy_follows_the_tenants_thresholds(tenant, amount, currency, needed):
    ApprovalSettings.objects.create(tenant=tenant, payment_threshold=Decimal("100"),
                                    payment_second_threshold=Decimal("1000"), threshold_currency="EUR")
    tenant.refresh_from_db()

    policy = approvals.amount_policy(tenant, Decimal(amount), currency, summary="Pay")

    assert (policy.approvals_required if policy else None) == needed
    if policy:
        assert (policy.amount, policy.currency) == (Decimal(amount), currency)


def test_without_a_threshold_payments_need_no_approval(tenant):
    assert approvals.amount_policy(tenant, Decimal("1000000"), "EUR", summary="Pay") is None


def test_a_tenants_request_lifetime_sets_expires_at(caller, tenant):
    ApprovalSettings.objects.create(tenant=tenant, request_ttl_minutes=5)

    request = pending_request(call(caller, "publish_announcement", idempotency_key="a-1", **STAFF_NOTE))

    assert request.expires_at - request.created_at == timedelta(minutes=5)


def test_other_tenants_keys_are_their_own(caller, other_tenant):
    pending_request(call(caller, "publish_announcement", idempotency_key="a-1", **STAFF_NOTE))
    theirs = call(Caller(tenant_id=other_tenant.pk, actor="agent:globex/x"), "publish_announcement",
                  idempotency_key="a-1", **STAFF_NOTE)

    assert pending_request(theirs).tenant_id == other_tenant.pk
    assert ApprovalRequest.objects.count() == 2
