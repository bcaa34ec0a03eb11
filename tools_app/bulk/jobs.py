"""django-q2 entry points of bulk actions: a batch of one (queued by name, core.jobs) and the sweep of
those whose job was lost (a schedule, tools_app.schedules)."""

from __future__ import annotations

from tools_app.bulk.actions import run_batch, sweep


def run(bulk_id: int) -> dict[str, int]:
    """One batch of bulk action `bulk_id`; it queues the next."""
    return run_batch(bulk_id)


def sweep_stalled() -> int:
    """Queue again the running bulk actions whose job was lost."""
    return sweep()
