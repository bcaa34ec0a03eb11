"""After the decision: running an approved operation once, and ending requests that can no longer run.

    pending --approve (N people)--> approved --job runs it--> executed | failed
       |--reject (reason)--> rejected
       `--expires_at passes (sweep)--> expired

Approval enqueues the `run_approved` job (jobs.py). It moves the record AWAITING_APPROVAL ->
PROCESSING by a conditional UPDATE and runs the tool through the same record, so a second
approval, a redelivered job or an agent's retry cannot run it twice. Rejection and expiry end
the record as FAILED(permission_denied): retries with the key get that answer.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from tools_app import engine
from tools_app.approvals.models import (
    ApprovalRequest,
    ApprovalStatus,
)
from tools_app.core import audit, jobs
from tools_app.core.errors import ErrorClass, PermissionDenied, ToolFailure
from tools_app.engine.models import IdempotencyRecord, RecordStatus
from tools_app.toolkit import registry
from tools_app.toolkit.calls import Caller, validate_arguments, write_operation

SWEEPER = "system:approvals"


# An approved request whose job has not moved it for this long is queued again.
REDRIVE_AFTER = timedelta(minutes=5)


SWEEP_BATCH = 500


def dispatch(request: ApprovalRequest) -> None:
    # The ORM broker writes the job in our transaction: no approval without
    # its job, and no job for an approval that rolled back.
    jobs.enqueue("approvals.run_approved", request.pk, task_name=f"approval-{request.pk}")


def approved_operation(request: ApprovalRequest) -> tuple[engine.Operation, engine.Executor]:
    """The requester's call, rebuilt from what was approved."""
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
    engine.close_unapproved(request.record, failure, actor=SWEEPER, reason=failure.message)
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
    engine.close_unapproved(
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
        dispatch(request)
    return True
