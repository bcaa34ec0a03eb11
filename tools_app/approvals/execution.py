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

from tools_app import engine
from tools_app.approvals.models import (
    ApprovalRequest,
    ApprovalStatus,
)
from tools_app.core import clock, db, jobs
from tools_app.core.errors import ErrorClass, PermissionDenied, ToolFailure
from tools_app.engine.models import IdempotencyRecord, RecordStatus
from tools_app.toolkit import registry
from tools_app.toolkit.calls import Caller, validate_arguments, write_operation

APPROVAL_SWEEPER = "system:approval-sweep"


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
    # Under the version the record was fingerprinted with: a deploy between request and approval changes nothing.
    if request.fingerprint != operation.fingerprint_at(request.record.fingerprint_version):
        raise PermissionDenied("the arguments no longer match what was approved; nothing was executed")
    return operation, execute


@transaction.atomic
def abandon(request: ApprovalRequest, failure: ToolFailure) -> bool:
    """APPROVED -> FAILED when the approved call cannot even be rebuilt; its record fails with it."""
    if not db.transition(request, {"status": ApprovalStatus.APPROVED}, {
        "status": ApprovalStatus.FAILED, "finished_at": clock.NOW, "reason": failure.message,
    }, action="approval.failed", actor=APPROVAL_SWEEPER, reason=failure.message,
            before={"status": ApprovalStatus.APPROVED}, after={"status": ApprovalStatus.FAILED}):
        return False
    engine.close_unapproved(request.record, failure, actor=APPROVAL_SWEEPER, reason=failure.message)
    return True


@transaction.atomic
def settle(request: ApprovalRequest) -> ApprovalStatus | None:
    """APPROVED -> EXECUTED | FAILED once its record has a final outcome.

    A transient failure is not final (a retry with the key, or the sweep,
    runs it again), so the request stays APPROVED meanwhile. A final record
    outcome never changes, so reading it before the guarded UPDATE is safe;
    of two racing settlers the status guard lets one through.
    """
    record_status, error_class = IdempotencyRecord.objects.filter(pk=request.record_id).values_list(
        "status", "error_class").get()
    if record_status == RecordStatus.SUCCEEDED:
        status = ApprovalStatus.EXECUTED
    elif record_status == RecordStatus.FAILED and error_class != ErrorClass.TRANSIENT:
        status = ApprovalStatus.FAILED
    else:
        return None
    if not db.transition(request, {"status": ApprovalStatus.APPROVED}, {
        "status": status, "finished_at": clock.NOW,
    }, action=f"approval.{status}", actor=APPROVAL_SWEEPER, before={"status": ApprovalStatus.APPROVED},
            after={"status": status}):
        return None
    return status


@transaction.atomic
def expire(request: ApprovalRequest) -> bool:
    """PENDING -> EXPIRED past expires_at (by the database's clock), and its record AWAITING_APPROVAL -> FAILED."""
    now = clock.NOW
    why = "no decision before the request expired"
    if not db.transition(request, {"status": ApprovalStatus.PENDING, "expires_at__lte": now}, {
        "status": ApprovalStatus.EXPIRED, "finished_at": now, "reason": why,
    }, action="approval.expired", actor=APPROVAL_SWEEPER, reason=why, before={"status": ApprovalStatus.PENDING},
            after={"status": ApprovalStatus.EXPIRED}):
        return False
    engine.close_unapproved(
        request.record, PermissionDenied("the approval request expired without a decision; nothing was executed. "
                                         "To ask again, call with a new idempotency_key"),
        actor=APPROVAL_SWEEPER, reason=why)
    return True


def redrive(request: ApprovalRequest, *, seen: datetime | None) -> bool:
    """Queue an approved request's job again if nobody did since `seen` (its last dispatch)."""
    with transaction.atomic():
        if not db.transition(request, {"status": ApprovalStatus.APPROVED, "dispatched_at": seen},
                             {"dispatched_at": clock.NOW}, action="approval.redriven", actor=APPROVAL_SWEEPER):
            return False
        dispatch(request)
    return True
