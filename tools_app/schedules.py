"""Periodic jobs, run by the django-q2 cluster as schedules.

Declared here once; `ensure_schedules` (run after every migrate) creates or
updates them by name. django-q2's scheduler looks at schedules about every
30 seconds, so one minute is the shortest period; jobs that must react
sooner are also enqueued directly when their trigger happens.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings


@dataclass(frozen=True)
class PeriodicJob:
    name: str
    func: str  # dotted path of a function taking no arguments
    minutes: int = 1


PERIODIC_JOBS: list[PeriodicJob] = [
    # Dead executors' records → UNKNOWN, then ask downstream what happened.
    PeriodicJob("idemops: expire leases and reconcile", "tools_app.reconciliation.run_periodic"),
    # Events whose delivery is due (new ones also wake the relay directly).
    PeriodicJob("idemops: outbox relay", "tools_app.outbox.relay_pending"),
    # Expire overdue approval requests, settle finished ones, re-queue stalled ones.
    PeriodicJob(name="approvals.sweep", func="tools_app.approvals.sweep"),
    # Link newly committed audit events into the hash chain.
    PeriodicJob(name="audit.seal", func="tools_app.audit.seal_periodically"),
    # Revives long tasks whose worker died and queues due retries (tools_app.tasks.sweep).
    PeriodicJob("idemops: task sweep", "tools_app.tasks.sweep", minutes=settings.IDEMOPS["TASK_SWEEP_MINUTES"]),
]


def ensure_schedules(**kwargs) -> None:
    from django_q.models import Schedule

    for job in PERIODIC_JOBS:
        Schedule.objects.update_or_create(
            name=job.name,
            defaults={"func": job.func, "schedule_type": Schedule.MINUTES, "minutes": job.minutes, "repeats": -1},
        )
