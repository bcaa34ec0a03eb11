"""Periodic jobs, run by the django-q2 cluster: schedules, and loops of a few seconds.

Schedules are declared here once; `ensure_schedules` (run after every
migrate) creates or updates them by name. django-q2's scheduler looks at
schedules about every 30 seconds, so one minute is the shortest period; jobs
that must react sooner are also enqueued directly when their trigger happens.

What must run more often than that is a loop: `start_loops` (connected to
django-q2's `post_spawn` signal) starts a thread in every worker process of
every cluster that runs the job every few seconds. Several loops may run the
same job at once; the job's transitions are guarded conditional updates, so
that costs a few indexed reads, never a double effect.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from django.db import close_old_connections
from django.utils.module_loading import import_string
from django_q.models import Schedule

from tools_app.conf import conf
from tools_app.core import counters, outage
from tools_app.core.jobs import JOBS

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PeriodicJob:
    name: str  # the Schedule row's name: its job's, so schedules, loops and jobs share one name
    job: str  # a job of core.jobs.JOBS taking no arguments
    minutes: int = 1


PERIODIC_JOBS: list[PeriodicJob] = [
    # Dead executors' records → UNKNOWN, then ask downstream what happened. The
    # loop below runs it every second; this schedule is its backstop.
    PeriodicJob("reconciliation.run_periodic", "reconciliation.run_periodic"),
    # Events whose delivery is due (new ones also wake the relay directly).
    PeriodicJob("outbox.relay", "outbox.relay"),
    # Expire overdue approval requests, settle finished ones, re-queue stalled ones.
    PeriodicJob("approvals.sweep", "approvals.sweep"),
    # Tell the approvers again about requests still waiting past their tenant's escalation time.
    PeriodicJob("approvals.escalate", "approvals.escalate"),
    # Link newly committed audit events into the hash chain.
    PeriodicJob("audit.seal", "audit.seal"),
    # The audit table's month partitions, IDEMOPS_AUDIT_PARTITION_MONTHS_AHEAD months ahead.
    PeriodicJob("audit.partitions", "audit.partitions", minutes=24 * 60),
    # Per-minute metric rows past IDEMOPS_METRICS_RETENTION_DAYS (the running totals stay).
    PeriodicJob("metrics.prune", "metrics.prune", minutes=60),
    # Revives long tasks whose worker died and queues due retries (tools_app.tasks.sweep).
    PeriodicJob("tasks.sweep", "tasks.sweep", minutes=conf().task_sweep_minutes),
    # Bulk actions whose job was lost (no progress for IDEMOPS_BULK_STALL_MINUTES) are queued again.
    PeriodicJob("bulk.sweep", "bulk.sweep"),
    # Scheduled operations whose tick came due (tools_app.scheduling); the loop below runs it every
    # IDEMOPS_SCHEDULE_TICK_SECONDS, this schedule is its backstop.
    PeriodicJob("scheduling.tick", "scheduling.tick"),
    # Arguments, results, checkpoints and documents past their retention (tools_app.retention).
    PeriodicJob("retention.purge", "retention.purge", minutes=conf().retention_purge_minutes),
]


@dataclass(frozen=True)
class LoopJob:
    name: str
    job: str  # a job of core.jobs.JOBS taking no arguments
    seconds: float  # pause between two runs; 0 turns the loop off


LOOP_JOBS: list[LoopJob] = [
    # A dead executor's key settles within its lease plus this period, even
    # if no caller asks for it again (a caller that does settles it itself).
    LoopJob("reconciliation.run_periodic", "reconciliation.run_periodic",
            seconds=conf().lease_sweep_seconds),
    # A killed worker's task is handed on within its lease plus this period (the schedule below
    # is the backstop when no cluster runs loops).
    LoopJob("tasks.sweep", "tasks.sweep", seconds=conf().lease_sweep_seconds),
    # Operators' and agents' scheduled operations (tools_app.scheduling) run within this of their tick.
    LoopJob("scheduling.tick", "scheduling.tick", seconds=conf().schedule_tick_seconds),
]


def start_loops(**kwargs: object) -> list[threading.Thread]:
    """django-q2 `post_spawn` receiver: start this worker process's loops (daemon threads:
    they end with the process, which django-q2 replaces, loops and all)."""
    threads = [threading.Thread(target=_loop, args=(job,), name=job.name, daemon=True)
               for job in LOOP_JOBS if job.seconds > 0]
    for thread in threads:
        thread.start()
    return threads


def _loop(job: LoopJob) -> None:
    func = import_string(JOBS[job.job])
    while True:
        time.sleep(job.seconds)
        try:
            # A connection broken by a database restart is replaced here, as
            # Django does around each request (CONN_HEALTH_CHECKS).
            close_old_connections()
            func()
            # What the job counted (a lost job requeued, a lease expired) is written by this loop
            # itself, not left to the process's flusher thread: in a worker of a cluster that was
            # frozen (SIGSTOP) and continued, that thread was seen to stop waking, and django-q2 ends
            # a worker without running its exit hooks, so those counts were lost.
            counters.flush()
        except outage.DATABASE_ERRORS as exc:  # an outage: the next round tries again
            outage.log(job.name, exc)
        except Exception:
            logger.exception("%s failed; it runs again in %ss", job.name, job.seconds)


def ensure_schedules(**kwargs: object) -> None:
    # A schedule of ours under a name no job has any more (a rename) would run its job twice.
    ours = {JOBS[job.job] for job in PERIODIC_JOBS}
    Schedule.objects.filter(func__in=ours).exclude(name__in=[job.name for job in PERIODIC_JOBS]).delete()
    for job in PERIODIC_JOBS:
        Schedule.objects.update_or_create(
            name=job.name,
            defaults={"func": JOBS[job.job], "schedule_type": Schedule.MINUTES, "minutes": job.minutes, "repeats": -1},
        )
