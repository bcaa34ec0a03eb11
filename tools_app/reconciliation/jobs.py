"""django-q2 entry points of reconciliation: the periodic lease sweep plus due reconciliations (also
run every second by the cluster's loop, tools_app.schedules), and a run of the due ones.
"""

from __future__ import annotations

from tools_app import engine
from tools_app.core import clock
from tools_app.engine.models import IdempotencyRecord, RecordStatus
from tools_app.reconciliation.reconcile import RECONCILE_SWEEPER, reconcile_record, take_turn


def run_periodic() -> dict[str, int]:
    """What the django-q2 schedule runs: expire dead executors' leases, then reconcile what is due."""
    expired = len(engine.expire_leases())
    return {"expired_leases": expired, **reconcile_due()}


def reconcile_due(limit: int = 100) -> dict[str, int]:
    counts = {"succeeded": 0, "failed": 0, "unknown": 0}
    due = IdempotencyRecord.objects.filter(status=RecordStatus.UNKNOWN, escalated_at__isnull=True,
                                           next_reconcile_at__lte=clock.NOW).order_by("next_reconcile_at")
    for record in due[:limit]:
        if take_turn(record):
            counts[reconcile_record(record, actor=RECONCILE_SWEEPER)] += 1
    return counts
