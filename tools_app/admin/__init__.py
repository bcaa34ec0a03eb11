"""The operators' admin, one module per concept."""

from tools_app.admin import (  # noqa: F401
    approvals,
    audit,
    auditors,
    business,
    dashboard,
    outbox,
    records,
    retention,
    tasks,
    tenants,
    unknown_outcomes,
)
