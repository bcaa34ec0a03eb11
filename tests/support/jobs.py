"""Run the django-q2 jobs queued in the test database, in this process (no cluster).

Jobs are real rows in the ORM broker's queue (django_q_ormq), written in the
transaction that queued them; this takes them in order, removes each, and
calls its function, as a worker would.
"""

from __future__ import annotations

from typing import Any

from django.utils.module_loading import import_string
from django_q.models import OrmQ


def queued_jobs() -> list[dict[str, Any]]:
    return [row.task for row in OrmQ.objects.order_by("id")]


def run_queued_jobs() -> list[Any]:
    results = []
    for row in OrmQ.objects.order_by("id"):
        task = row.task
        if not OrmQ.objects.filter(pk=row.pk).delete()[0]:
            continue  # another runner took it
        func = import_string(task["func"]) if isinstance(task["func"], str) else task["func"]
        results.append(func(*task["args"], **task["kwargs"]))
    return results
