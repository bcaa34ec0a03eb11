"""Human approval of sensitive operations.

A tool is sensitive when its declaration has an `approval` rule: a function
of (tenant, validated arguments) returning an `ApprovalPolicy` (the summary
an operator reads, how many people must approve, the amount) or None when
this call may run at once.

A sensitive call is claimed by the engine like any write. Just before it
would execute, the engine asks `gate`: the record moves to AWAITING_APPROVAL
and an ApprovalRequest bound to it (and to its fingerprint) is created, in
one transaction; the caller gets `pending_approval`. Retries with the same
key and arguments follow the record and get the same request; other
arguments get `conflict` (the engine checks the fingerprint first).

    pending ──approve (N distinct people)──▶ approved ──job runs it──▶ executed | failed
       ├──reject (reason required)────────▶ rejected
       └──expires_at passes (sweep)───────▶ expired

Approval enqueues `run_approved` (django-q2). It moves the record
AWAITING_APPROVAL -> PROCESSING by a conditional UPDATE and runs the tool
through the same record, so a second approval, a redelivered job or an
agent's retry cannot run it twice. Rejection and expiry end the record as
FAILED(permission_denied): retries with the key get that answer.

Who may decide: users with `tools_app.decide_approvalrequest`, on tenants
they may see (`APPROVE`, `REJECT`, checked by tenants.authorize), never on
their own request. Every decision and every refused attempt is an audit
event. Row order when both change: the request first, then its record.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Case, F, Q, Value, When
from django.utils import timezone
from django_q.tasks import async_task
from pydantic import BaseModel

from tools_app import audit, idempotency, registry, tenants
from tools_app.errors import PendingApproval, PermissionDenied, ToolFailure
from tools_app.idempotency import Outcome
from tools_app.models import (
    ApprovalDecision,
    ApprovalRequest,
    ApprovalSettings,
    ApprovalStatus,
    ApprovalVerdict,
    ErrorClass,
    IdempotencyRecord,
    RecordStatus,
    Tenant,
)

SWEEPER = "system:approvals"
DECIDE_PERMISSION = "tools_app.decide_approvalrequest"
# How soon an agent should ask again: a person decides in minutes; an
# approved call runs within seconds.
PENDING_RETRY_AFTER = 30.0
APPROVED_RETRY_AFTER = 2.0
# An approved request whose job has not moved it for this long is queued again.
REDRIVE_AFTER = timedelta(minutes=5)
SWEEP_BATCH = 500


@dataclass(frozen=True)
class ApprovalPolicy:
    """What a sensitive call needs before it runs."""

    summary: str  # shown to the operator: what will happen, to what, for how much
    approvals_required: int = 1
    amount: Decimal | None = None
    currency: str = ""
    ttl: timedelta | None = None  # None: the tenant's request_ttl_minutes


class ApprovalRefused(Exception):
    """A decision that was not taken (and was audited): the message says why."""


# --- policies ------------------------------------------------------------------


def tenant_settings(tenant: Tenant) -> ApprovalSettings:
    """The tenant's approval settings, or the defaults if it has none."""
    try:
        return tenant.approval_settings
    except ApprovalSettings.DoesNotExist:
        return ApprovalSettings(tenant=tenant)


def amount_policy(tenant: Tenant, amount: Decimal, currency: str, *, summary: str) -> ApprovalPolicy | None:
    """For money-moving tools (e.g. request_payment): approval above the tenant's thresholds.

    One approver above `payment_threshold`, two above `payment_second_threshold`.
    An amount in another currency than the thresholds' cannot be compared, so
    it is treated as above both configured thresholds.
    """
    config = tenant_settings(tenant)
    if config.payment_threshold is None:
        return None
    comparable = currency == config.threshold_currency
    if comparable and amount <= config.payment_threshold:
        return None
    second = config.payment_second_threshold
    two = second is not None and (not comparable or amount > second)
    return ApprovalPolicy(summary=summary, approvals_required=2 if two else 1, amount=amount, currency=currency)


# --- the engine's side: divert, follow ----------------------------------------------


def gate(spec: registry.ToolSpec, tenant_id: int, actor: str, args: BaseModel
         ) -> Callable[[IdempotencyRecord], Outcome | None]:
    """The check the engine runs before executing a sensitive call (Operation.approval)."""

    def check(record: IdempotencyRecord) -> Outcome | None:
        existing = ApprovalRequest.objects.filter(record=record).first()
        if existing is not None:
            # Only an approved request's own operation runs (its job, or a retry
            # after a transient failure of that run).
            if existing.status == ApprovalStatus.APPROVED and existing.fingerprint == record.fingerprint:
                return None
            raise PermissionDenied(f"approval request {existing.pk} is {existing.status.lower()}; "
                                   "this operation may not run")
        tenant = Tenant.objects.get(pk=tenant_id)
        policy = spec.approval(tenant, args)
        if policy is None:
            return None
        request = request_approval(record, policy, tenant=tenant, actor=actor,
                                   arguments=args.model_dump(mode="json", exclude={"idempotency_key"}))
        return Outcome(record, error=pending_error(request))

    return check


@transaction.atomic
def request_approval(record: IdempotencyRecord, policy: ApprovalPolicy, *, tenant: Tenant,
                     arguments: dict[str, Any], actor: str) -> ApprovalRequest:
    """PROCESSING -> AWAITING_APPROVAL, and a PENDING request bound to the record, in one transaction."""
    idempotency.await_approval(record, actor=actor)
    now = timezone.now()
    ttl = policy.ttl or timedelta(minutes=tenant_settings(tenant).request_ttl_minutes)
    request = ApprovalRequest.objects.create(
        tenant_id=record.tenant_id, record=record, fingerprint=record.fingerprint, tool=record.tool,
        arguments=arguments, summary=policy.summary, amount=policy.amount, currency=policy.currency,
        requested_by=actor, trace_id=record.trace_id or uuid.uuid4().hex,
        required_approvals=policy.approvals_required, created_at=now, expires_at=now + ttl,
    )
    audit.record_event(action="approval.requested", obj=request, actor=actor, trace_id=request.trace_id,
                       after={"status": request.status, "record": record.pk, "tool": record.tool,
                              "required_approvals": request.required_approvals,
                              "expires_at": request.expires_at.isoformat()})
    return request


def follow(record: IdempotencyRecord) -> Outcome:
    """A same-key, same-arguments call while the record awaits approval: the same request again."""
    request = ApprovalRequest.objects.get(record=record)
    return Outcome(record, replayed=True, error=pending_error(request))


def pending_error(request: ApprovalRequest) -> PendingApproval:
    info = {"approval": approval_info(request)}
    if request.status == ApprovalStatus.APPROVED:
        return PendingApproval("approved; the operation is being executed. Ask again with the same "
                               "idempotency_key for its result", retry_after=APPROVED_RETRY_AFTER, details=info)
    people = "one person" if request.required_approvals == 1 else f"{request.required_approvals} people"
    return PendingApproval(
        f"this operation needs approval by {people}; nothing has been executed. Ask again with the same "
        f"idempotency_key, or call get_approval_status with request_id {request.pk}, after retry_after. "
        f"It expires at {request.expires_at.isoformat()}",
        retry_after=PENDING_RETRY_AFTER, details=info)


def approval_info(request: ApprovalRequest) -> dict[str, Any]:
    return {
        "request_id": request.pk, "status": request.status.lower(), "summary": request.summary,
        "expires_at": request.expires_at.isoformat(), "approvals_required": request.required_approvals,
        "approvals_given": request.approvals,
    }


# --- operators' decisions ------------------------------------------------------------


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
        _dispatch(request)
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
    idempotency.close_unapproved(
        request.record, PermissionDenied(f"rejected by an approver: {reason}. Nothing was executed"),
        actor=actor, reason=reason)


def _not_pending(request: ApprovalRequest) -> str:
    current = ApprovalRequest.objects.filter(pk=request.pk).values_list("status", "expires_at").first()
    status, expires_at = current
    if status == ApprovalStatus.PENDING and expires_at <= timezone.now():
        return "the request has expired"
    return f"the request is no longer pending (it is {status.lower()})"


# --- execution -------------------------------------------------------------------------


def _dispatch(request: ApprovalRequest) -> None:
    # The ORM broker writes the job in our transaction: no approval without
    # its job, and no job for an approval that rolled back.
    async_task("tools_app.approvals.run_approved", request.pk, task_name=f"approval-{request.pk}")


def run_approved(request_id: int) -> str:
    """django-q2 job: execute an approved request once, through its idempotency record."""
    request = ApprovalRequest.objects.select_related("record").get(pk=request_id)
    if request.status != ApprovalStatus.APPROVED:
        return request.status  # a redelivered or repeated job: already settled
    try:
        operation, execute = approved_operation(request)
    except ToolFailure as failure:  # the tool or its arguments changed since the request
        abandon(request, failure)
        return ApprovalStatus.FAILED
    if idempotency.execute_approved(request.record, operation, execute) is None:
        # Not AWAITING_APPROVAL any more: another job ran it, or its run failed
        # transiently; `run` replays, waits, or re-runs a transient failure.
        idempotency.run(operation, execute)
    settle(request)
    request.refresh_from_db()
    return request.status


def approved_operation(request: ApprovalRequest) -> tuple[idempotency.Operation, idempotency.Executor]:
    """The requester's call, rebuilt from what was approved."""
    from tools_app.calls import Caller, validate_arguments, write_operation  # calls builds on this module

    spec = registry.get_tool(request.tool)
    args = validate_arguments(spec, {**request.arguments, "idempotency_key": request.record.key})
    operation, execute = write_operation(spec, Caller(tenant_id=request.tenant_id, actor=request.requested_by),
                                         args)
    if operation.fingerprint != request.fingerprint:
        raise PermissionDenied("the arguments no longer match what was approved; nothing was executed")
    return operation, execute


@transaction.atomic
def abandon(request: ApprovalRequest, failure: ToolFailure) -> bool:
    """APPROVED -> FAILED when the approved call cannot even be rebuilt; its record fails with it."""
    now = timezone.now()
    if not ApprovalRequest.objects.filter(pk=request.pk, status=ApprovalStatus.APPROVED).update(
            status=ApprovalStatus.FAILED, finished_at=now, reason=failure.message):
        return False
    audit.record_event(action="approval.failed", obj=request, actor=SWEEPER, reason=failure.message,
                       trace_id=request.trace_id, before={"status": ApprovalStatus.APPROVED},
                       after={"status": ApprovalStatus.FAILED})
    idempotency.close_unapproved(request.record, failure, actor=SWEEPER, reason=failure.message)
    return True


@transaction.atomic
def settle(request: ApprovalRequest) -> ApprovalStatus | None:
    """APPROVED -> EXECUTED | FAILED once its record has a final outcome.

    A transient failure is not final (a retry with the key, or the sweep,
    runs it again), so the request stays APPROVED meanwhile.
    """
    now = timezone.now()
    records = IdempotencyRecord.objects.filter(pk=request.record_id)
    for status, record_done in (
        (ApprovalStatus.EXECUTED, records.filter(status=RecordStatus.SUCCEEDED)),
        (ApprovalStatus.FAILED, records.filter(status=RecordStatus.FAILED).exclude(error_class=ErrorClass.TRANSIENT)),
    ):
        # The status guard stays on the request row itself (not in a join), so
        # PostgreSQL re-checks it if two settlers race.
        if ApprovalRequest.objects.filter(pk=request.pk, status=ApprovalStatus.APPROVED,
                                          record_id__in=record_done.values("pk")).update(status=status,
                                                                                         finished_at=now):
            audit.record_event(action=f"approval.{status.lower()}", obj=request, actor=SWEEPER,
                               trace_id=request.trace_id, before={"status": ApprovalStatus.APPROVED},
                               after={"status": status})
            return status
    return None


# --- the sweep (periodic job) ------------------------------------------------------------


@transaction.atomic
def expire(request: ApprovalRequest) -> bool:
    """PENDING -> EXPIRED past expires_at, and its record AWAITING_APPROVAL -> FAILED."""
    now = timezone.now()
    why = "no decision before the request expired"
    if not ApprovalRequest.objects.filter(pk=request.pk, status=ApprovalStatus.PENDING, expires_at__lte=now).update(
            status=ApprovalStatus.EXPIRED, finished_at=now, reason=why):
        return False
    audit.record_event(action="approval.expired", obj=request, actor=SWEEPER, reason=why, trace_id=request.trace_id,
                       before={"status": ApprovalStatus.PENDING}, after={"status": ApprovalStatus.EXPIRED})
    idempotency.close_unapproved(
        request.record, PermissionDenied("the approval request expired without a decision; nothing was executed. "
                                         "To ask again, call with a new idempotency_key"),
        actor=SWEEPER, reason=why)
    return True


def redrive(request: ApprovalRequest, *, seen: datetime | None) -> bool:
    """Queue an approved request's job again if nobody did since `seen` (its last dispatch)."""
    with transaction.atomic():
        if not ApprovalRequest.objects.filter(pk=request.pk, status=ApprovalStatus.APPROVED,
                                              dispatched_at=seen).update(dispatched_at=timezone.now()):
            return False
        audit.record_event(action="approval.redriven", obj=request, actor=SWEEPER, trace_id=request.trace_id)
        _dispatch(request)
    return True


def sweep(now: datetime | None = None) -> dict[str, int]:
    """Expire overdue requests, settle finished ones, re-queue stalled approved ones."""
    now = now or timezone.now()
    overdue = ApprovalRequest.objects.filter(status=ApprovalStatus.PENDING, expires_at__lte=now)
    approved = ApprovalRequest.objects.filter(status=ApprovalStatus.APPROVED)
    finished = approved.filter(Q(record__status=RecordStatus.SUCCEEDED)
                               | (Q(record__status=RecordStatus.FAILED) & ~Q(record__error_class=ErrorClass.TRANSIENT)))
    stalled = approved.filter(Q(record__status=RecordStatus.AWAITING_APPROVAL)
                              | Q(record__status=RecordStatus.FAILED, record__error_class=ErrorClass.TRANSIENT,
                                  record__retry_not_before__lte=now),
                              dispatched_at__lte=now - REDRIVE_AFTER)
    return {
        "expired": sum(expire(r) for r in overdue.order_by("expires_at")[:SWEEP_BATCH]),
        "settled": sum(settle(r) is not None for r in finished.order_by("pk")[:SWEEP_BATCH]),
        "redriven": sum(redrive(r, seen=r.dispatched_at) for r in stalled.order_by("pk")[:SWEEP_BATCH]),
    }


# --- reading -------------------------------------------------------------------------------


def status_for_agent(tenant_id: int, request_id: int) -> dict[str, Any] | None:
    """What the status tool shows: the request, and the operation's outcome once there is one."""
    request = ApprovalRequest.objects.select_related("record").filter(tenant_id=tenant_id, pk=request_id).first()
    if request is None:
        return None
    record = request.record
    info = approval_info(request)
    info.update(tool=request.tool, reason=request.reason or None,
                decided_at=request.decided_at.isoformat() if request.decided_at else None,
                result=record.result if record.status == RecordStatus.SUCCEEDED else None,
                error=({"class": record.error_class, "message": record.error_message}
                       if record.status == RecordStatus.FAILED else None))
    return info
