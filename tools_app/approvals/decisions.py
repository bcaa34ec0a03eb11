"""Operators' decisions on approval requests: approve (N distinct people) or reject (with a reason).

Who may decide: users with `tools_app.decide_approvalrequest` on the request's tenant
(access.authorize with APPROVE / REJECT), never on their own request. Every decision and every
refused attempt is an audit event. Row order when both change: the request first, then its record.
"""

from __future__ import annotations

from django.db import IntegrityError, transaction
from django.db.models import Case, F, Q, Value, When
from django.utils import timezone

from tools_app import engine
from tools_app.access import tenants
from tools_app.approvals import execution
from tools_app.approvals.models import (
    ApprovalDecision,
    ApprovalRequest,
    ApprovalStatus,
    ApprovalVerdict,
)
from tools_app.core import audit
from tools_app.core.errors import PermissionDenied

DECIDE_PERMISSION = "tools_app.decide_approvalrequest"


class ApprovalRefused(Exception):
    """A decision that was not taken (and was audited): the message says why."""


APPROVE = tenants.Permit(DECIDE_PERMISSION, ApprovalVerdict.APPROVE, "approve or reject requests", "approval.refused")


REJECT = tenants.Permit(DECIDE_PERMISSION, ApprovalVerdict.REJECT, "approve or reject requests", "approval.refused")


class _Refusal(Exception):
    pass


def approve(request: ApprovalRequest, user, *, reason: str = "") -> ApprovalRequest:
    """Count `user`'s approval; the last one needed approves the request and queues its execution."""
    return _decide(request, user, APPROVE, reason, _count_approval)


def reject(request: ApprovalRequest, user, *, reason: str) -> ApprovalRequest:
    """Reject the request (a reason is required); the operation will never run."""
    return _decide(request, user, REJECT, reason, _reject)


def _decide(request, user, permit: tenants.Permit, reason, take) -> ApprovalRequest:
    try:
        actor = tenants.authorize(user, permit, request)
    except PermissionDenied as denied:  # already audited
        raise ApprovalRefused(denied.message) from None
    reason = (reason or "").strip()
    try:
        _check_decision(request, actor, permit, reason)
        with transaction.atomic():
            _record_decision(request, user, permit.attempted, reason)
            take(request, actor, reason)
    except _Refusal as refusal:
        tenants.audit_refusal(permit, request, actor, str(refusal))
        raise ApprovalRefused(str(refusal)) from None
    request.refresh_from_db()
    return request


def _check_decision(request: ApprovalRequest, actor: str, permit: tenants.Permit, reason: str) -> None:
    """The rules of deciding, for someone who may decide on this tenant's requests."""
    if actor == request.requested_by:
        raise _Refusal("self-approval: the requester cannot decide on its own request")
    if permit is REJECT and not reason:
        raise _Refusal("a rejection needs a reason")


def _record_decision(request: ApprovalRequest, user, verdict: str, reason: str) -> None:
    # The unique (request, user) constraint is what makes N approvals N people.
    try:
        with transaction.atomic():
            ApprovalDecision.objects.create(request=request, user=user, verdict=verdict, reason=reason,
                                            created_at=timezone.now())
    except IntegrityError:
        raise _Refusal("you have already decided on this request") from None


def _count_approval(request: ApprovalRequest, actor: str, reason: str) -> None:
    """PENDING -> PENDING (one more approver) or -> APPROVED (the last one needed), in one UPDATE.

    Concurrent approvers serialize on the row: each UPDATE re-reads the row
    after the other commits, so exactly one of them flips it to APPROVED,
    and only that one queues the execution.
    """
    now = timezone.now()
    last = Q(approvals__gte=F("required_approvals") - 1)
    updated = ApprovalRequest.objects.filter(pk=request.pk, status=ApprovalStatus.PENDING, expires_at__gt=now).update(
        approvals=F("approvals") + 1,
        status=Case(When(last, then=Value(ApprovalStatus.APPROVED)), default=Value(ApprovalStatus.PENDING)),
        decided_at=Case(When(last, then=Value(now)), default=None),
        decided_by=Case(When(last, then=Value(actor)), default=Value("")),
        dispatched_at=Case(When(last, then=Value(now)), default=None),
    )
    if not updated:
        raise _Refusal(_not_pending(request))
    before = {"status": ApprovalStatus.PENDING, "approvals": request.approvals}
    request.refresh_from_db()
    after = {"status": request.status, "approvals": request.approvals}
    if request.status == ApprovalStatus.APPROVED:
        audit.record_event(action="approval.approved", obj=request, actor=actor, reason=reason,
                           trace_id=request.trace_id, before=before, after=after)
        execution.dispatch(request)
    else:
        audit.record_event(action="approval.approval_counted", obj=request, actor=actor, reason=reason,
                           trace_id=request.trace_id, before=before, after=after)


def _reject(request: ApprovalRequest, actor: str, reason: str) -> None:
    """PENDING -> REJECTED and its record AWAITING_APPROVAL -> FAILED, in one transaction."""
    now = timezone.now()
    if not ApprovalRequest.objects.filter(pk=request.pk, status=ApprovalStatus.PENDING, expires_at__gt=now).update(
            status=ApprovalStatus.REJECTED, reason=reason, decided_at=now, decided_by=actor, finished_at=now):
        raise _Refusal(_not_pending(request))
    audit.record_event(action="approval.rejected", obj=request, actor=actor, reason=reason, trace_id=request.trace_id,
                       before={"status": ApprovalStatus.PENDING}, after={"status": ApprovalStatus.REJECTED})
    engine.close_unapproved(
        request.record, PermissionDenied(f"rejected by an approver: {reason}. Nothing was executed"),
        actor=actor, reason=reason)


def _not_pending(request: ApprovalRequest) -> str:
    current = ApprovalRequest.objects.filter(pk=request.pk).values_list("status", "expires_at").first()
    status, expires_at = current
    if status == ApprovalStatus.PENDING and expires_at <= timezone.now():
        return "the request has expired"
    return f"the request is no longer pending (it is {status.lower()})"
