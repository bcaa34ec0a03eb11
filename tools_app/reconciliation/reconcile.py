"""Reconciliation: finding out what became of UNKNOWN outcomes, never guessing.

A record is UNKNOWN when its executor could not tell whether the side effect
happened (a timeout after sending, a crash: see `engine.expire_lease`).
Each tool declares a reconciler that asks the downstream system by the key
we sent; its answer moves the record:

- `Found(result)`    → SUCCEEDED, the downstream result stored so a replay returns it;
- `NotDone(reason)`  → FAILED (transient), so the same key may run again;
- `StillUnknown`     → stays UNKNOWN, tried again after core.backoff's delay; after
  RECONCILE_MAX_ATTEMPTS it is escalated to a person (the admin's UNKNOWN queue).

Operators' decisions (reconcile now, resolve with evidence) are in
operators.py, behind their permits; the periodic job and a follower that
took a dead executor's record reconcile through `reconcile_record`, as the system.

Each reconciliation is a span in the trace of the call that left the record UNKNOWN (the
downstream is asked with that trace's `traceparent`), one log line (`reconciliation`) and a
count (`idemops_reconciliations_total{tool,result}`); so is an operator's resolution.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.utils import timezone

from idemops.conf import conf
from tools_app import engine
from tools_app.core import backoff, counters, jobs, logs, tracing
from tools_app.core.errors import Transient
from tools_app.engine import evidence_entry
from tools_app.engine.models import IdempotencyRecord, RecordStatus
from tools_app.toolkit.policies import Answer, Found, NotDone, StillUnknown, nothing_committed
from tools_app.toolkit.registry import ToolSpec, get_tool

logger = logging.getLogger(__name__)
SWEEP_ACTOR = "system:reconciler"


def reconciler_for(spec: ToolSpec):
    return spec.reconciler or nothing_committed


def take_turn(record: IdempotencyRecord) -> bool:
    """Push the record's next attempt forward; only the process whose UPDATE
    matched reconciles it now (two schedulers never ask downstream twice)."""
    claimed_until = timezone.now() + timedelta(seconds=conf().reconcile_turn_seconds)
    return bool(IdempotencyRecord.objects.filter(
        pk=record.pk, status=RecordStatus.UNKNOWN, next_reconcile_at=record.next_reconcile_at,
    ).update(next_reconcile_at=claimed_until))


def settle_expired(record: IdempotencyRecord) -> None:
    """Right after a follower took a dead executor's record (PROCESSING -> UNKNOWN).

    A tool whose effect is local needs nobody to ask: nothing committed, so
    the record is settled now (FAILED, transient) and the follower's own
    call runs the operation again. A downstream tool's answer is the
    downstream system's: its reconciliation is queued now, not at the next sweep.
    """
    if reconciler_for(get_tool(record.tool)) is nothing_committed:
        record.refresh_from_db()
        if take_turn(record):
            reconcile_record(record, actor=SWEEP_ACTOR)
    else:
        reconcile_soon()


# --- one record -----------------------------------------------------------------------


def reconcile_record(record: IdempotencyRecord, *, actor: str = SWEEP_ACTOR) -> str:
    """Ask the downstream system and apply its answer, as `actor` (the system unless an operator's
    checked call passes theirs). Returns the record's status word: the one this call set, or, if
    another reconciler moved the record first (the guarded transition did not match), what it is now."""
    with tracing.continued(record.trace_id, record.span_id, f"reconcile {record.tool}", **{
            "idemops.tool": record.tool, "idemops.operation_id": str(record.operation_id)}) as span:
        result, moved = _reconcile(record, actor)
        span.set_attribute("idemops.result", result)
        observed(record, result, actor=actor, counted=moved)
        return result


def observed(record: IdempotencyRecord, result: str, *, actor: str, counted: bool = True) -> None:
    """Count a reconciliation's result and log its line (operators' resolutions come through here too).
    A reconciler that lost the race (`counted` false) logs what it found but counts nothing: the
    winner counted that reconciliation already."""
    if counted:
        counters.count(counters.RECONCILIATION, tool=record.tool, tenant_id=record.tenant_id, label=result)
    logs.get(__name__).info("reconciliation", tool=record.tool, tenant_id=record.tenant_id, record_id=record.pk,
                            operation_id=str(record.operation_id), result=result, actor=actor,
                            attempts=record.reconcile_attempts, escalated=record.escalated_at is not None,
                            lost_race=None if counted else True)


def _reconcile(record: IdempotencyRecord, actor: str) -> tuple[str, bool]:
    """(status word, whether this call's transition moved the record)."""
    answer = _ask(record)
    match answer:
        case Found(result, evidence):
            moved = engine.resolve_succeeded(record, result, actor=actor, reason="found downstream",
                                             evidence=evidence or evidence_entry("reconciler", found=True))
            word = "succeeded"
        case NotDone(reason, evidence):
            failure = Transient(f"the first call did not take effect ({reason}); retry with the same key",
                                retry_after=0)
            moved = engine.resolve_failed(record, failure, actor=actor, reason=reason,
                                          evidence=evidence or evidence_entry("reconciler", found=False))
            word = "failed"
        case StillUnknown(evidence):
            moved = engine.note_unresolved(record, evidence=evidence or evidence_entry("reconciler"),
                                           next_attempt_at=next_attempt_at(record.reconcile_attempts + 1),
                                           actor=actor)
            word = "unknown"
        case _:
            raise AssertionError(f"unexpected reconciler answer {answer!r}")
    if moved:
        return word, True
    record.refresh_from_db()
    return record.status.lower(), False


def _ask(record: IdempotencyRecord) -> Answer:
    try:
        return reconciler_for(get_tool(record.tool))(record)
    except Exception as exc:  # a reconciler that fails tells us nothing new
        logger.warning("reconciler for %s raised %s", record.tool, type(exc).__name__)
        return StillUnknown(evidence_entry("reconciler", error=type(exc).__name__))


# The longest wait between two reconciliation attempts of a record.
BACKOFF_MAX_SECONDS = 3600


def next_attempt_at(attempt: int) -> datetime | None:
    """When to ask again after the `attempt`-th attempt (core.backoff); None once the attempts
    are used up (escalate)."""
    if attempt >= conf().reconcile_max_attempts:
        return None
    delay = backoff.delay(attempt, base=conf().reconcile_backoff_seconds, ceiling=BACKOFF_MAX_SECONDS)
    return timezone.now() + timedelta(seconds=delay)


def reconcile_soon() -> None:
    """Enqueue a reconciliation run now rather than at the next schedule tick
    (the ORM broker's enqueue joins the caller's transaction, if any)."""
    jobs.enqueue("reconciliation.reconcile_due", task_name="reconcile-due")
