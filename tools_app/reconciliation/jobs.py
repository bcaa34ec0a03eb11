"""django-q2 entry points of reconciliation: the periodic lease sweep plus due reconciliations (also
run every second by the cluster's loop, tools_app.schedules), and a run of the due ones.
"""

from __future__ import annotations

from collections import Counter
from contextlib import nullcontext

from tools_app import engine, incidents
from tools_app.conf import conf
from tools_app.core import clock
from tools_app.engine.models import IdempotencyRecord, RecordStatus
from tools_app.reconciliation.reconcile import RECONCILE_SWEEPER, reconcile_record, take_turn
from tools_app.toolkit.registry import find_tool


def run_periodic() -> dict[str, int]:
    """What the django-q2 schedule runs: expire dead executors' leases, then reconcile what is due."""
    expired = len(engine.expire_leases())
    return {"expired_leases": expired, **reconcile_due()}


# Lookups of one downstream system in one run (about a second): after an outage hundreds of records
# come due together, and asking for all at once could knock the downstream over again. While its
# breaker is open, one lookup per run tests it.
LOOKUPS_PER_RUN = 20


def reconcile_due(limit: int = 100) -> dict[str, int]:
    """Reconcile the UNKNOWN records that are due, paced per downstream system: at most
    LOOKUPS_PER_RUN each (one while its breaker is open), each holding one of its in-flight slots
    (incidents.in_flight) like any call to it; a record left out now is asked at a later run."""
    counts = {"succeeded": 0, "failed": 0, "unknown": 0}
    due = IdempotencyRecord.objects.filter(status=RecordStatus.UNKNOWN, escalated_at__isnull=True,
                                           next_reconcile_at__lte=clock.NOW).order_by("next_reconcile_at")
    asked: Counter[str] = Counter()
    for record in due[:limit]:
        spec = find_tool(record.tool)
        downstream = incidents.downstream_of(record.tool, spec.downstream if spec else None)
        if downstream is not None:
            if asked[downstream] >= (1 if incidents.breaker_open(downstream) else LOOKUPS_PER_RUN):
                continue
            asked[downstream] += 1
        try:
            with (incidents.in_flight(downstream, seconds=conf().reconcile_turn_seconds) if downstream
                  else nullcontext()):
                if take_turn(record):
                    counts[reconcile_record(record, actor=RECONCILE_SWEEPER)] += 1
        except incidents.Full:
            continue  # its turn comes at a later run
    return counts
