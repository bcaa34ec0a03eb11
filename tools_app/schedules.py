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
