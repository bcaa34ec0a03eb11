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

A downstream system that reports outcomes by itself (the payment gateway's signed callback,
the demo's idemops_demo.callbacks) settles a record at once through `settle_by_callback`: the same
answers, the same guarded transitions, so a late or duplicate report changes nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from enum import StrEnum
from typing import Any

from tools_app import engine
from tools_app.conf import conf
from tools_app.core import backoff, clock, counters, jobs, logs, tracing
from tools_app.core.errors import Transient
from tools_app.engine import evidence_entry
from tools_app.engine.models import IdempotencyRecord, RecordStatus
from tools_app.toolkit.policies import Answer, Found, NotDone, StillUnknown, nothing_committed
from tools_app.toolkit.registry import ToolSpec, find_tool, get_tool, sent_call

logger = logging.getLogger(__name__)
RECONCILE_SWEEPER = "system:reconciler"


def reconciler_for(spec: ToolSpec) -> Callable[[Any], Any]:
    """The tool's reconciler, given a SentCall (registry.sent_call); a transactional tool's answers NotDone."""
    return spec.reconciler or nothing_committed


def take_turn(record: IdempotencyRecord) -> bool:
    """Push the record's next attempt forward; only the process whose UPDATE
    matched reconciles it now (two schedulers never ask downstream twice)."""
    return bool(IdempotencyRecord.objects.filter(
        pk=record.pk, status=RecordStatus.UNKNOWN, next_reconcile_at=record.next_reconcile_at,
    ).update(next_reconcile_at=clock.later(conf().reconcile_turn_seconds)))


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
            reconcile_record(record, actor=RECONCILE_SWEEPER)
    else:
        reconcile_soon()


# --- one record -----------------------------------------------------------------------


def reconcile_record(record: IdempotencyRecord, *, actor: str = RECONCILE_SWEEPER) -> str:
    """Ask the downstream system and apply its answer, as `actor` (the system unless an operator's
    checked call passes theirs). Returns the record's status word: the one this call set, or, if
    another reconciler moved the record first (the guarded transition did not match), what it is now."""
    with tracing.continued(record.trace_id, record.span_id, f"reconcile {record.tool}", **{
            "idemops.tool": record.tool, "idemops.operation_id": str(record.operation_id)}) as span:
        result = apply_answer(record, _ask(record), actor=actor)
        span.set_attribute("idemops.result", result)
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


def apply_answer(record: IdempotencyRecord, answer: Answer, *, actor: str, reason: str = "found downstream") -> str:
    """Move an UNKNOWN record as the downstream system's answer says (guarded: a record that is
    no longer UNKNOWN is left as it is), counted and logged. Returns the answer's word, or the
    record's status word now if another reconciler moved it first."""
    match answer:
        case Found(result, evidence):
            spec = find_tool(record.tool)
            moved = engine.resolve_succeeded(record, result, actor=actor, reason=reason,
                                             evidence=evidence or evidence_entry("reconciler", found=True),
                                             search_fields=spec.search_fields if spec else frozenset())
            word = "succeeded"
        case NotDone(why, evidence):
            failure = Transient(f"the first call did not take effect ({why}); retry with the same key",
                                retry_after=0)
            moved = engine.resolve_failed(record, failure, actor=actor, reason=why,
                                          evidence=evidence or evidence_entry("reconciler", found=False))
            word = "failed"
        case StillUnknown(evidence):
            moved = engine.note_unresolved(record, evidence=evidence or evidence_entry("reconciler"),
                                           next_attempt_in=next_attempt_in(record.reconcile_attempts + 1),
                                           actor=actor)
            word = "unknown"
        case _:
            raise AssertionError(f"unexpected reconciler answer {answer!r}")
    if moved:
        observed(record, word, actor=actor)
        return word
    record.refresh_from_db()
    word = record.status
    observed(record, word, actor=actor, counted=False)
    return word


class CallbackVerdict(StrEnum):
    """What became of a downstream system's report of an outcome (the callback's answer says it)."""

    SETTLED = "settled"  # the record was UNKNOWN and now has the reported outcome
    ALREADY_FINAL = "already final"  # a late or duplicate report: the record's outcome stands
    IN_FLIGHT = "in flight"  # its executor is still waiting for the answer: report again later
    UNKNOWN_KEY = "unknown key"  # no record sent this key


def settle_by_callback(downstream_key: str, answer: Found | NotDone, *, actor: str) -> CallbackVerdict:
    """A downstream system reports the outcome of the operation it knows by `downstream_key`:
    an UNKNOWN record takes it at once, as the reconciler's answer would (the same guarded
    transition, so of a report and a reconciliation racing, one moves the record)."""
    operation_id = engine.operation_id_of(downstream_key)
    record = IdempotencyRecord.objects.filter(operation_id=operation_id).first() if operation_id else None
    if record is None or record.downstream_key != downstream_key:
        return CallbackVerdict.UNKNOWN_KEY
    if record.status == RecordStatus.PROCESSING:
        return CallbackVerdict.IN_FLIGHT
    if record.status != RecordStatus.UNKNOWN:
        return CallbackVerdict.ALREADY_FINAL
    word = apply_answer(record, answer, actor=actor, reason="reported by the downstream system")
    # Of a report and a reconciliation racing, whichever moved the record first settled it.
    return CallbackVerdict.IN_FLIGHT if word == "unknown" else CallbackVerdict.SETTLED


def _ask(record: IdempotencyRecord) -> Answer:
    try:
        spec = get_tool(record.tool)
        answer: Answer = reconciler_for(spec)(sent_call(record, spec))  # what a reconciler returns (registry)
        return answer
    except Exception as exc:  # a reconciler that fails tells us nothing new
        logger.warning("reconciler for %s raised %s", record.tool, type(exc).__name__)
        return StillUnknown(evidence_entry("reconciler", error=type(exc).__name__))


# The longest wait between two reconciliation attempts of a record.
BACKOFF_MAX_SECONDS = 3600


def next_attempt_in(attempt: int) -> float | None:
    """Seconds until asking again after the `attempt`-th attempt (core.backoff); None once the
    attempts are used up (escalate)."""
    if attempt >= conf().reconcile_max_attempts:
        return None
    return backoff.delay(attempt, base=conf().reconcile_backoff_seconds, ceiling=BACKOFF_MAX_SECONDS)


def reconcile_soon() -> None:
    """Enqueue a reconciliation run now rather than at the next schedule tick
    (the ORM broker's enqueue joins the caller's transaction, if any)."""
    jobs.enqueue("reconciliation.reconcile_due", task_name="reconcile-due")
