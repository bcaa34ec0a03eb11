"""Reconciliation: finding out what became of UNKNOWN outcomes, never guessing.

A record is UNKNOWN when its executor could not tell whether the side effect
happened (a timeout after sending, a crash: see `idempotency.expire_lease`).
Each tool declares a reconciler that asks the downstream system by the key
we sent; its answer moves the record:

- `Found(result)`    → SUCCEEDED, the downstream result stored so a replay returns it;
- `NotDone(reason)`  → FAILED (transient), so the same key may run again;
- `StillUnknown`     → stays UNKNOWN, tried again with backoff; after
  RECONCILE_MAX_ATTEMPTS it is escalated to a person (the admin's UNKNOWN queue).

Operators reconcile now, or resolve escalated (or any) UNKNOWN records with
evidence, which needs the `tools_app.resolve_unknown` permission on the
record's tenant (`RECONCILE`, `RESOLVE`); every decision and every refusal
is audited. The periodic job reconciles through `_reconcile`, as the system.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone

from tools_app import idempotency, tenants
from tools_app.errors import InvalidInput, Transient
from tools_app.idempotency import evidence_entry
from tools_app.models import IdempotencyRecord, RecordStatus
from tools_app.registry import ToolSpec, get_tool

logger = logging.getLogger(__name__)
SWEEP_ACTOR = "system:reconciler"
RESOLVE_PERMISSION = "tools_app.resolve_unknown"
RECONCILE = tenants.Permit(RESOLVE_PERMISSION, "reconcile", "reconcile UNKNOWN outcomes", "record.reconcile_refused")
RESOLVE = tenants.Permit(RESOLVE_PERMISSION, "resolve", "resolve UNKNOWN outcomes", "record.resolve_refused")


@dataclass
class Found:
    result: dict[str, Any]
    evidence: dict[str, Any] = field(default_factory=dict)


@dataclass
class NotDone:
    reason: str
    evidence: dict[str, Any] = field(default_factory=dict)


@dataclass
class StillUnknown:
    evidence: dict[str, Any] = field(default_factory=dict)


Answer = Found | NotDone | StillUnknown


def nothing_committed(record: IdempotencyRecord) -> NotDone:
    """The reconciler of every transactional tool: its effect commits with the
    record, so a record that never reached SUCCEEDED did nothing."""
    return NotDone("the local transaction never committed",
                   evidence_entry("reconciler", note="transactional tool: no committed effect"))


def reconciler_for(spec: ToolSpec):
    return spec.reconciler or nothing_committed


# --- the periodic job -------------------------------------------------------------


def run_periodic() -> dict[str, int]:
    """What the django-q2 schedule runs: expire dead executors' leases, then reconcile what is due."""
    expired = len(idempotency.expire_leases())
    return {"expired_leases": expired, **reconcile_due()}


def reconcile_due(limit: int = 100) -> dict[str, int]:
    counts = {"succeeded": 0, "failed": 0, "unknown": 0}
    due = IdempotencyRecord.objects.filter(status=RecordStatus.UNKNOWN, escalated_at__isnull=True,
                                           next_reconcile_at__lte=timezone.now()).order_by("next_reconcile_at")
    for record in due[:limit]:
        if _take_turn(record):
            counts[_reconcile(record, actor=SWEEP_ACTOR)] += 1
    return counts


def _take_turn(record: IdempotencyRecord) -> bool:
    """Push the record's next attempt forward; only the process whose UPDATE
    matched reconciles it now (two schedulers never ask downstream twice)."""
    claimed_until = timezone.now() + timedelta(seconds=settings.IDEMOPS["RECONCILE_TURN_SECONDS"])
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
        if _take_turn(record):
            _reconcile(record, actor=SWEEP_ACTOR)
    else:
        reconcile_soon()


idempotency.on_lease_expired(settle_expired)


# --- one record -----------------------------------------------------------------------


def _reconcile(record: IdempotencyRecord, *, actor: str) -> str:
    """Ask the downstream system and apply its answer. Returns the record's status word."""
    answer = _ask(record)
    match answer:
        case Found(result, evidence):
            idempotency.resolve_succeeded(record, result, actor=actor, reason="found downstream",
                                          evidence=evidence or evidence_entry("reconciler", found=True))
            return "succeeded"
        case NotDone(reason, evidence):
            failure = Transient(f"the first call did not take effect ({reason}); retry with the same key",
                                retry_after=0)
            idempotency.resolve_failed(record, failure, actor=actor, reason=reason,
                                       evidence=evidence or evidence_entry("reconciler", found=False))
            return "failed"
        case StillUnknown(evidence):
            idempotency.note_unresolved(record, evidence=evidence or evidence_entry("reconciler"),
                                        next_attempt_at=next_attempt_at(record.reconcile_attempts + 1), actor=actor)
            return "unknown"
    raise AssertionError(f"unexpected reconciler answer {answer!r}")


def _ask(record: IdempotencyRecord) -> Answer:
    try:
        return reconciler_for(get_tool(record.tool))(record)
    except Exception as exc:  # a reconciler that fails tells us nothing new
        logger.warning("reconciler for %s raised %s", record.tool, type(exc).__name__)
        return StillUnknown(evidence_entry("reconciler", error=type(exc).__name__))


def next_attempt_at(attempt: int) -> datetime | None:
    """Exponential backoff with jitter; None once the attempts are used up (escalate)."""
    if attempt >= settings.IDEMOPS["RECONCILE_MAX_ATTEMPTS"]:
        return None
    base = settings.IDEMOPS["RECONCILE_BACKOFF_SECONDS"] * 2 ** (attempt - 1)
    delay = min(base, 3600) * random.uniform(0.8, 1.2)
    return timezone.now() + timedelta(seconds=delay)


# --- operators -------------------------------------------------------------------------


def reconcile(record: IdempotencyRecord, user) -> str:
    """An operator's "reconcile now": ask the downstream system at once, due or not."""
    actor = tenants.authorize(user, RECONCILE, record)
    if record.status != RecordStatus.UNKNOWN:
        raise InvalidInput("this record is no longer UNKNOWN; reload it")
    return _reconcile(record, actor=actor)


def resolve_by_operator(record: IdempotencyRecord, user, *, succeeded: bool, reason: str,
                        downstream_reference: str = "") -> None:
    """An operator's decision on an UNKNOWN record, with evidence. Refusals are audited too."""
    actor = tenants.authorize(user, RESOLVE, record)
    if not reason.strip():
        raise InvalidInput("a resolution needs a reason")
    evidence = evidence_entry("operator", actor=actor, reason=reason, downstream_reference=downstream_reference)
    if succeeded:
        spec = get_tool(record.tool)
        if not downstream_reference or spec.result_for_reference is None:
            raise InvalidInput("resolving as succeeded needs a downstream reference this tool can look up")
        result = spec.result_for_reference(record, downstream_reference)
        done = idempotency.resolve_succeeded(record, result, actor=actor, reason=reason, evidence=evidence)
    else:
        failure = Transient(f"an operator found the first call did not take effect: {reason}", retry_after=0)
        done = idempotency.resolve_failed(record, failure, actor=actor, reason=reason, evidence=evidence)
    if not done:
        raise InvalidInput("this record is no longer UNKNOWN; reload it")


def reconcile_soon() -> None:
    """Enqueue a reconciliation run now rather than at the next schedule tick
    (the ORM broker's enqueue joins the caller's transaction, if any)."""
    from django_q.tasks import async_task

    async_task("tools_app.reconciliation.reconcile_due", task_name="reconcile-due")
