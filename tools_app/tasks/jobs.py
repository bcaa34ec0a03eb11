"""django-q2 entry points of long tasks: run a task's pipeline, and the periodic sweep.
"""

from __future__ import annotations

import logging
import time

from tools_app.core import clock, leases
from tools_app.tasks import state, waits
from tools_app.tasks.models import Task, TaskStatus
from tools_app.tasks.runner import Runner
from tools_app.tasks.state import expire_lease, requeue, without_a_job

logger = logging.getLogger(__name__)


def sweep() -> dict[str, int]:
    """The periodic safety net: end tasks past their deadline, revive tasks whose worker died, queue
    due retries and lost jobs, and wake parked tasks whose wait is over (tools_app.tasks.waits).
    (The cluster's loop runs it every IDEMOPS_LEASE_SWEEP_SECONDS.)"""
    counts = {"past_deadline": 0, "expired": 0, "requeued": 0, "woken": 0}
    # First: a task past its deadline ends, whatever else is wrong with it (a dead worker's too).
    for task in state.past_deadline():
        counts["past_deadline"] += state.end_at_deadline(task)
    for task in Task.objects.filter(status=TaskStatus.RUNNING, lease_expires_at__lt=clock.NOW).order_by("pk"):
        counts["expired"] += expire_lease(task)
    for task in without_a_job():
        counts["requeued"] += requeue(task)
    counts["woken"] = waits.wake_due()
    if any(counts.values()):
        logger.info("task sweep: %s", counts)
    return counts


def run_task(task_id: str) -> str:
    """django-q2 job: run the task as far as it goes. Returns what happened, for django-q2's log."""
    outcome = "not taken (not runnable, or another worker holds it)"
    while True:
        owner = leases.new_owner()
        task = state.take(task_id, owner)
        if task is None:
            return outcome
        outcome, retry_in = Runner(task, owner).run()
        if retry_in is None:
            return outcome
        # A short backoff is waited out here; the task is `retrying` meanwhile
        # and anyone (a cancel, another job) may change it before we take it again.
        time.sleep(retry_in)
