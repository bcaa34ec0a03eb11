"""Operators' decisions on approval requests: approve (N distinct people) or reject (with a reason).

Who may decide: users with `tools_app.decide_approvalrequest` on the request's tenant
(access.authorize with APPROVE / REJECT), never on their own request. Four eyes: the owner of the
agent token that asked (ApiToken.owner, kept on the request as `requester_owner`) may reject it but
never approve it, so no one person both asks (through their agent) and agrees. Every decision and
every refused attempt is an audit event. Approving an amount above the tenant's step-up amount
needs a second-factor code entered within IDEMOPS_STEP_UP_MINUTES (`thresholds.needs_step_up`).
Row order when both change: the request first, then its record.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from tools_app import access, engine
from tools_app.access import second_factor
from tools_app.approvals import execution, thresholds
from tools_app.approvals.models import (
    ApprovalDecision,
    ApprovalRequest,
    ApprovalStatus,
    ApprovalVerdict,
)
from tools_app.conf import conf
from tools_app.core import clock, db
from tools_app.core.errors import PermissionDenied, Refused

if TYPE_CHECKING:
    from django.contrib.auth.models import User

DECIDE_PERMISSION = "tools_app.decide_approvalrequest"


APPROVE = access.Permit(DECIDE_PERMISSION, ApprovalVerdict.APPROVE, "approve or reject requests", "approval.refused")


REJECT = access.Permit(DECIDE_PERMISSION, ApprovalVerdict.REJECT, "approve or reject requests", "approval.refused")


def approve(request: ApprovalRequest, user: User, *, reason: str = "") -> ApprovalRequest:
    """Count `user`'s approval; the last one needed approves the request and queues its execution."""
    return _decide(request, user, APPROVE, reason, _count_approval)


def reject(request: ApprovalRequest, user: User, *, reason: str) -> ApprovalRequest:
    """Reject the request (a reason is required); the operation will never run."""
    return _decide(request, user, REJECT, reason, _reject)


def _decide(request: ApprovalRequest, user: User, permit: access.Permit, reason: str,
            take: Callable[[ApprovalRequest, str, str], None]) -> ApprovalRequest:
    try:
        actor = access.authorize(user, permit, request)
    except PermissionDenied as denied:  # already audited
        raise Refused(denied.message) from None
    if permit is APPROVE and thresholds.needs_step_up(request) and not second_factor.fresh(
            user, conf().step_up_minutes):
        refusal = (f"step-up: approving this amount needs a second-factor code entered within the last "
                   f"{conf().step_up_minutes:g} minutes; enter a new one and approve again")
        access.audit_refusal(permit, request, actor, refusal)
        raise second_factor.StaleSecondFactor(refusal, request)
    reason = (reason or "").strip()
    try:
        _check_decision(request, user, actor, permit, reason)
        with transaction.atomic():
            _record_decision(request, user, permit.attempted, reason)
            take(request, actor, reason)
    except Refused as refusal:
        access.audit_refusal(permit, request, actor, refusal.reason)
        raise
    request.refresh_from_db()
    return request


def _check_decision(request: ApprovalRequest, user: User, actor: str, permit: access.Permit, reason: str) -> None:
    """The rules of deciding, for someone who may decide on this tenant's requests."""
    if actor == request.requested_by:
        raise Refused("self-approval: the requester cannot decide on its own request")
    if permit is APPROVE and request.requester_owner_id is not None and request.requester_owner_id == user.pk:
        raise Refused(f"four eyes: you own the agent that asked ({request.requested_by}); another approver "
                       "must approve it (you may reject it)")
    if permit is REJECT and not reason:
        raise Refused("a rejection needs a reason")


def _record_decision(request: ApprovalRequest, user: User, verdict: str, reason: str) -> None:
    # The unique (request, user) constraint is what makes N approvals N people.
    try:
        with transaction.atomic():
            ApprovalDecision.objects.create(request=request, user=user, verdict=verdict, reason=reason,
                                            created_at=timezone.now())
    except IntegrityError:
        raise Refused("you have already decided on this request") from None


def _count_approval(request: ApprovalRequest, actor: str, reason: str) -> None:
    """PENDING -> PENDING (one more approver) or -> APPROVED (the last one needed), with its audit event.

    Concurrent approvers serialize on the row, locked first as their UPDATE
    would lock it (FOR NO KEY UPDATE: it does not wait for the key-share
    locks of their decision rows): each counts from what the one before
    committed, so exactly one of them flips it to APPROVED, and only that
    one queues the execution.
    """
    now = clock.NOW  # the deadline is the database's
    locked = ApprovalRequest.objects.select_for_update(no_key=True).get(pk=request.pk)
    counted = locked.approvals + 1
    last = counted >= locked.required_approvals
    changes: dict[str, Any] = {"approvals": counted}
    if last:
        changes.update(status=ApprovalStatus.APPROVED, decided_at=now, decided_by=actor, dispatched_at=now)
    if not db.transition(locked, {"status": ApprovalStatus.PENDING, "approvals": locked.approvals,
                                  "expires_at__gt": now}, changes,
                         action="approval.approved" if last else "approval.approval_counted", actor=actor,
                         reason=reason, before={"status": ApprovalStatus.PENDING, "approvals": locked.approvals},
                         after={"status": changes.get("status", ApprovalStatus.PENDING), "approvals": counted}):
        raise Refused(_not_pending(request))
    if last:
        execution.dispatch(locked)


def _reject(request: ApprovalRequest, actor: str, reason: str) -> None:
    """PENDING -> REJECTED and its record AWAITING_APPROVAL -> FAILED, in one transaction."""
    now = clock.NOW
    if not db.transition(request, {"status": ApprovalStatus.PENDING, "expires_at__gt": now}, {
        "status": ApprovalStatus.REJECTED, "reason": reason, "decided_at": now, "decided_by": actor, "finished_at": now,
    }, action="approval.rejected", actor=actor, reason=reason, before={"status": ApprovalStatus.PENDING},
            after={"status": ApprovalStatus.REJECTED}):
        raise Refused(_not_pending(request))
    engine.close_unapproved(
        request.record, PermissionDenied(f"rejected by an approver: {reason}. Nothing was executed"),
        actor=actor, reason=reason)


def _not_pending(request: ApprovalRequest) -> str:
    current = ApprovalRequest.objects.filter(pk=request.pk).values_list("status", "expires_at", clock.NOW).first()
    assert current is not None, "the request's row is never deleted"
    status, expires_at, now = current
    if status == ApprovalStatus.PENDING and expires_at <= now:
        return "the request has expired"
    return f"the request is no longer pending (it is {status})"
