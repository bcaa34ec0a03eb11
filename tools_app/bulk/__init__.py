"""Bulk recovery by filter: one audited action over what a filter selects in the UNKNOWN queue, failed or
paused tasks, or dead-lettered outbox events, run by the job cluster in batches, with progress and a stop.

`selection.py` builds the selection (tool, downstream, error class, time range, tenant, business
attributes; within the operator's tenants) and counts it (the dry run); `actions.py` confirms an action
(permission, second factor, step-up for money tools, the selection frozen, audited), runs it in batches
through each concept's own operator function, stops it and re-queues a lost one; `jobs.py` holds the
django-q2 entry points. The console's page is tools_app/admin/bulk.py; docs/runbook.md#bulk-recovery.

May import: core, access, engine, incidents, toolkit, outbox, approvals, reconciliation, tasks.
"""

from tools_app.bulk.actions import (
    ACTIONS,
    RUN,
    RUN_PERMISSION,
    Action,
    actions_for,
    authorize,
    progress,
    run_batch,
    start,
    stop,
    sweep,
    visible,
)
from tools_app.bulk.models import BulkAction, BulkItem, BulkState
from tools_app.bulk.selection import Filter, Target, count, search_field_names, selection, tools_of

__all__ = [
    "ACTIONS", "RUN", "RUN_PERMISSION", "Action", "BulkAction", "BulkItem", "BulkState", "Filter", "Target",
    "actions_for", "authorize", "count", "progress", "run_batch", "search_field_names", "selection", "start",
    "stop", "sweep", "tools_of", "visible",
]
