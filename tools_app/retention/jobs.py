"""django-q2 entry point of the purge (scheduled in tools_app/schedules.py)."""

from __future__ import annotations

import logging

from tools_app.retention.purge import purge

logger = logging.getLogger(__name__)


def purge_expired() -> dict[str, int]:
    """django-q2 job: purge what is past its retention (retention.purge); returns the counts per kind."""
    report = purge()
    if report.total:
        logger.info("retention purge: %s in %s batch(es)", report.purged, report.batches)
    return report.purged
