"""django-q2 entry points of approvals: run an approved request, the periodic sweep, and escalation.
"""

from __future__ import annotations

from datetime import datetime

from django.db.models import Expression, Q

from tools_app import engine
from tools_app.approvals.execution import (
    REDRIVE_AFTER,
    SWEEP_BATCH,
    abandon,
    approved_operation,
    expire,
    redrive,
    settle,
)
from tools_app.approvals.models import (
    ApprovalRequest,
    ApprovalStatus,
)
from tools_app.approvals.notices import escalate_due
from tools_app.core import clock, tracing
from tools_app.core.errors import ErrorClass, ToolFailure
from tools_app.engine.models import RecordStatus
from tools_app.toolkit import registry
from tools_app.toolkit.calls import observed


def run_approved(request_id: int) -> str:
    """django-q2 job: execute an approved request once, through its idempotency record, in the trace
    of the call that asked for it."""
    request = ApprovalRequest.objects.select_related("record").get(pk=request_id)
    if request.status != ApprovalStatus.APPROVED:
        return request.status  # a redelivered or repeated job: already settled
    record = request.record
    with tracing.continued(record.trace_id, record.span_id, f"approved {request.tool}",
                           **{"idemops.tool": request.tool, "idemops.approval_request": request.pk}):
        try:
            operation, execute = approved_operation(request)
        except ToolFailure as failure:  # the tool or its arguments changed since the request
            abandon(request, failure)
            return ApprovalStatus.FAILED
        with observed(registry.get_tool(request.tool), request.tenant_id, request.arguments, key=record.key,
                      approval_request=request.pk):
            if engine.execute_approved(record, operation, execute) is None:
                # Not AWAITING_APPROVAL any more: another job ran it, or its run failed
                # transiently; `run` replays, waits, or re-runs a transient failure.
                engine.run(operation, execute)
        settle(request)
        request.refresh_from_db()
        return request.status


def sweep(now: datetime | None = None) -> dict[str, int]:
    """Expire overdue requests, settle finished ones, re-queue stalled approved ones (by the
    database's clock, unless a test gives `now`)."""
    at: datetime | Expression = now or clock.NOW
    overdue = ApprovalRequest.objects.filter(status=ApprovalStatus.PENDING, expires_at__lte=at)
    approved = ApprovalRequest.objects.filter(status=ApprovalStatus.APPROVED)
    finished = approved.filter(Q(record__status=RecordStatus.SUCCEEDED)
                               | (Q(record__status=RecordStatus.FAILED) & ~Q(record__error_class=ErrorClass.TRANSIENT)))
    stalled = approved.filter(Q(record__status=RecordStatus.AWAITING_APPROVAL)
                              | Q(record__status=RecordStatus.FAILED, record__error_class=ErrorClass.TRANSIENT,
                                  record__retry_not_before__lte=at),
                              dispatched_at__lte=at - REDRIVE_AFTER)
    return {
        "expired": sum(expire(r) for r in overdue.order_by("expires_at")[:SWEEP_BATCH]),
        "settled": sum(settle(r) is not None for r in finished.order_by("pk")[:SWEEP_BATCH]),
        "redriven": sum(redrive(r, seen=r.dispatched_at) for r in stalled.order_by("pk")[:SWEEP_BATCH]),
    }


def escalate() -> int:
    """django-q2 job: escalate the requests still waiting past their tenant's escalation time."""
    return escalate_due()
