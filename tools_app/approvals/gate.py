"""The engine's side of approvals: which calls need a person (policies), diverting them into a
request, and what a caller hears while it waits.

Just before a sensitive call would execute, the engine asks `gate` (toolkit hooks): the record
moves to AWAITING_APPROVAL and an ApprovalRequest bound to it (and to its fingerprint) is
created, in one transaction; the caller gets `pending_approval`. Retries with the same key and
arguments follow the record (`follow`, an engine hook) and get the same request; other
arguments get `conflict` (the engine checks the fingerprint first).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import timedelta
from decimal import Decimal
from typing import Any

from django.db import transaction
from pydantic import BaseModel

from tools_app import access, engine
from tools_app.access.models import Tenant
from tools_app.approvals import notices
from tools_app.approvals.models import (
    ApprovalRequest,
    ApprovalSettings,
    ApprovalStatus,
)
from tools_app.core import audit, clock
from tools_app.core.errors import PendingApproval, PermissionDenied
from tools_app.engine import Outcome
from tools_app.engine.models import IdempotencyRecord, RecordStatus
from tools_app.toolkit import registry
from tools_app.toolkit.policies import ApprovalPolicy

# How soon an agent should ask again: a person decides in minutes; an
# approved call runs within seconds.
PENDING_RETRY_AFTER = 30.0


APPROVED_RETRY_AFTER = 2.0


def tenant_settings(tenant: Tenant) -> ApprovalSettings:
    """The tenant's approval settings, or the defaults if it has none."""
    return ApprovalSettings.of(tenant)


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


def gate(spec: registry.ToolSpec, tenant_id: int, actor: str, args: BaseModel
         ) -> Callable[[IdempotencyRecord], Outcome | None]:
    """The check the engine runs before executing a sensitive call (Operation.approval)."""
    approval = spec.approval
    assert approval is not None, f"{spec.name} is not a sensitive tool: it has no approval rule"

    def check(record: IdempotencyRecord) -> Outcome | None:
        existing = ApprovalRequest.objects.filter(record=record).first()
        if existing is not None:
            # Only an approved request's own operation runs (its job, or a retry
            # after a transient failure of that run).
            if existing.status == ApprovalStatus.APPROVED and existing.fingerprint == record.fingerprint:
                return None
            raise PermissionDenied(f"approval request {existing.pk} is {existing.status}; "
                                   "this operation may not run")
        tenant = Tenant.objects.get(pk=tenant_id)
        policy = approval(tenant, args)
        if policy is None:
            return None
        request = request_approval(record, policy, tenant=tenant, actor=actor,
                                   arguments=sent_arguments(args))
        return Outcome(record, error=pending_error(request))

    return check


def sent_arguments(args: BaseModel) -> dict[str, Any]:
    """The call's arguments as the approved call is rebuilt from them: what the caller sent, so the
    rebuilt call's fingerprint is the record's (defaults it left out are filled again when it runs)."""
    return args.model_dump(mode="json", exclude={"idempotency_key"}, exclude_unset=True)


@transaction.atomic
def request_approval(record: IdempotencyRecord, policy: ApprovalPolicy, *, tenant: Tenant,
                     arguments: dict[str, Any], actor: str) -> ApprovalRequest:
    """PROCESSING -> AWAITING_APPROVAL, and a PENDING request bound to the record, in one transaction."""
    engine.await_approval(record, actor=actor)
    now = clock.read()  # the deadline is the database's: every process compares it with the database's time
    ttl = policy.ttl or timedelta(minutes=tenant_settings(tenant).request_ttl_minutes)
    request = ApprovalRequest.objects.create(
        tenant_id=record.tenant_id, record=record, operation_id=record.operation_id, fingerprint=record.fingerprint,
        tool=record.tool,
        arguments=arguments, summary=policy.summary, amount=policy.amount, currency=policy.currency,
        requested_by=actor, requester_owner_id=access.owner_id_of(record.tenant_id, actor),
        trace_id=record.trace_id or uuid.uuid4().hex,
        required_approvals=policy.approvals_required, created_at=now, expires_at=now + ttl,
    )
    audit.record_event(action="approval.requested", obj=request, actor=actor, trace_id=request.trace_id,
                       after={"status": request.status, "record": record.pk, "tool": record.tool,
                              "required_approvals": request.required_approvals,
                              "expires_at": request.expires_at.isoformat()})
    notices.announce(request)
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
        "request_id": request.pk, "status": request.status, "summary": request.summary,
        "expires_at": request.expires_at.isoformat(), "approvals_required": request.required_approvals,
        "approvals_given": request.approvals,
    }


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
