"""The cluster's side: ticks come due (`plan`), occurrences run (`run_due`), both from `tick`, the job
the workers' loop runs every IDEMOPS_SCHEDULE_TICK_SECONDS (tools_app.schedules).

Several loops (every worker of every cluster) may run it at once. A schedule's due ticks are planned
under its row lock (SKIP LOCKED: another loop moves on), each as a ScheduledRun unique per (schedule,
tick); a run is taken by a guarded UPDATE (queued -> running); and its call carries the occurrence's
idempotency key, so even a run taken twice (a loop presumed dead that comes back) runs the tool once:
the second call is the engine's replay or follower.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Q

from tools_app.core import clock
from tools_app.scheduling.models import Overlap, RunStatus, ScheduledOperation, ScheduledRun
from tools_app.scheduling.operations import key_of, next_tick
from tools_app.toolkit import registry
from tools_app.toolkit.calls import Caller, call_tool

SCHEDULER = "system:scheduler"
# Ticks looked at per schedule and pass: a rule firing every second over a long outage is not walked
# tick by tick (past this many, the missed ones beyond the backfill are not recorded one by one).
MAX_TICKS_PER_PASS = 1000
SCHEDULES_PER_PASS = 100
# A run still `running` this long after it started is taken for lost (its loop died) and called again
# with its key: the engine answers what became of it, or runs it if nothing did.
LOST_AFTER = timedelta(seconds=60)
# Answers that leave an occurrence running: its operation is still under way (and retryable ones: below).
STILL_RUNNING = {"in_progress", "pending_approval"}


def tick() -> None:
    """One pass: plan what came due, then run the queued occurrences."""
    plan()
    run_due()


def plan() -> int:
    """Each due schedule's ticks up to now become runs: the latest `backfill` + 1 queued, older missed ones
    skipped; its next tick moves past now. Returns how many runs were queued."""
    queued = 0
    with transaction.atomic():
        now = clock.read()
        due = list(ScheduledOperation.objects.select_for_update(skip_locked=True)
                   .filter(paused=False, next_tick_at__lte=now).order_by("next_tick_at")[:SCHEDULES_PER_PASS])
        for row in due:
            queued += _plan_one(row, now)
    return queued


def _plan_one(row: ScheduledOperation, now: datetime) -> int:
    ticks: list[datetime] = []
    at: datetime | None = row.next_tick_at
    while at is not None and at <= now and len(ticks) < MAX_TICKS_PER_PASS:
        ticks.append(at)
        at = next_tick(row.cron, at) if row.cron else None
    if at is not None and at <= now:
        at = next_tick(row.cron, now)  # more missed ticks than a pass walks: the rest are not run either
    keep = ticks[-(row.backfill + 1):]
    missed = ticks[:len(ticks) - len(keep)]
    ScheduledRun.objects.bulk_create(
        [ScheduledRun(schedule=row, tick_at=t, key=key_of(row, t), status=RunStatus.SKIPPED,
                      outcome="missed", finished_at=now) for t in missed]
        + [ScheduledRun(schedule=row, tick_at=t, key=key_of(row, t)) for t in keep], ignore_conflicts=True)
    ScheduledOperation.objects.filter(pk=row.pk).update(next_tick_at=at)
    return len(keep)


def run_due() -> int:
    """Run the queued occurrences of unpaused schedules, each schedule's one after another, by its
    overlap policy. Returns how many were called."""
    called = 0
    # Queued runs, and running ones to ask again (their loop died, or their operation had not run yet).
    due = Q(status=RunStatus.QUEUED) | Q(status=RunStatus.RUNNING, started_at__lt=clock.read() - LOST_AFTER)
    schedule_ids = list(ScheduledRun.objects.filter(due, schedule__paused=False)
                        .order_by().values_list("schedule_id", flat=True).distinct()[:SCHEDULES_PER_PASS])
    for schedule_id in schedule_ids:
        while (run := _take(schedule_id)) is not None:
            _call(run)
            called += 1
    return called


def _take(schedule_id: int) -> ScheduledRun | None:
    """The schedule's next queued run, moved to running; or None (none queued, or one is running)."""
    with transaction.atomic():
        row = ScheduledOperation.objects.select_for_update(skip_locked=True).filter(
            pk=schedule_id, paused=False).first()
        if row is None:
            return None  # another loop holds it now, or it was paused
        now = clock.read()
        running = ScheduledRun.objects.filter(schedule=row, status=RunStatus.RUNNING).order_by("tick_at").first()
        if running is not None and running.started_at is not None and running.started_at > now - LOST_AFTER:
            if row.overlap == Overlap.SKIP:
                ScheduledRun.objects.filter(schedule=row, status=RunStatus.QUEUED).update(
                    status=RunStatus.SKIPPED, outcome="overlap", finished_at=now)
            return None
        run = running or ScheduledRun.objects.filter(schedule=row, status=RunStatus.QUEUED).order_by("tick_at").first()
        if run is None:
            return None
        ScheduledRun.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING, started_at=now)
        return run


def _call(run: ScheduledRun) -> None:
    row = run.schedule
    spec = registry.find_tool(row.tool)
    if spec is None:
        _finish(run, RunStatus.DONE, outcome="rejected", error_class="not_found")
        return
    result = call_tool(spec, Caller(tenant_id=row.tenant_id, actor=row.created_by),
                       {**row.arguments, "idempotency_key": run.key})
    error_class = str(result.error.error_class) if result.error is not None else ""
    operation_id = result.record.operation_id if result.record is not None else None
    if error_class in STILL_RUNNING or (result.error is not None and result.error.retryable):
        # Its operation is under way (another call of the key, a person's approval), or did not run yet
        # (transient, rate_limited: a paused tool, an open breaker): asked again with its key after
        # LOST_AFTER, until it runs or its key's retry window closes it (not_executed, final).
        ScheduledRun.objects.filter(pk=run.pk, status=RunStatus.RUNNING).update(
            operation_id=operation_id, outcome=str(result.outcome), error_class=error_class, started_at=clock.NOW)
        return
    _finish(run, RunStatus.DONE, outcome=str(result.outcome), error_class=error_class, operation_id=operation_id)


def _finish(run: ScheduledRun, status: str, **fields: object) -> None:
    """running -> `status`, with the call's outcome (the call itself is in the record's own audit trail)."""
    ScheduledRun.objects.filter(pk=run.pk, status=RunStatus.RUNNING).update(status=status, finished_at=clock.NOW,
                                                                             **fields)
