"""What the platform counts about itself: per-call counters (written in batches off the request
path) and the figures the operators' dashboard shows.

May import: core, access, engine, toolkit, and the concepts' models (approvals, tasks, outbox)
for the figures it reads.
"""

from tools_app.metrics.counters import FLUSH_INTERVAL_SECONDS, flush, record_call

__all__ = ["FLUSH_INTERVAL_SECONDS", "flush", "record_call"]
