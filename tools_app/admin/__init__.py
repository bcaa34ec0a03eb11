"""The operators' admin, one module per concept: queues first (pending approvals, UNKNOWN outcomes,
failed or stuck tasks, dead letters), then records, the audit log, settings and the dashboard.

Thin: every action calls the concept function that checks its Permit and makes the change
(`operator_actions.py` is the one pattern). May import: every package below the entry points.
"""

from tools_app.admin import (  # noqa: F401
    approvals,
    audit,
    auditors,
    bulk,
    channels,
    dashboard,
    downstreams,
    limits,
    oauth,
    outbox,
    records,
    retention,
    scheduling,
    tasks,
    tenants,
    unknown_outcomes,
)
