"""django-q2 entry point of the outbox: relay every due event.
"""

from __future__ import annotations

import dataclasses

from tools_app.outbox.relay import RelayReport, relay_batch


def relay_pending() -> dict[str, int]:
    """What the django-q2 job runs: batches until nothing is due."""
    total = RelayReport()
    while (report := relay_batch()).handled:
        total.delivered += report.delivered
        total.retried += report.retried
        total.dead += report.dead
    return dataclasses.asdict(total)
