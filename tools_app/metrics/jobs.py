"""django-q2 entry point of metrics: drop per-minute rows past their retention (the totals stay).
"""

from __future__ import annotations

from tools_app.metrics.rollup import prune


def prune_minutes() -> int:
    """What the hourly schedule runs (tools_app.schedules)."""
    return prune()
