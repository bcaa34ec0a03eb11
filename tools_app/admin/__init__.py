"""The operators' admin, one module per concept."""

from tools_app.admin import (  # noqa: F401
    approvals,
    audit,
    auditors,
    business,
    dashboard,
    limits,
    outbox,
    records,
    tasks,
    tenants,
    unknown_outcomes,
)
