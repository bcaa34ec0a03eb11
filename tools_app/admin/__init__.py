"""The operators' admin, one module per concept."""

from tools_app.admin import (  # noqa: F401
    approvals,
    audit,
    auditors,
    business,
    dashboard,
    outbox,
    records,
    tenants,
    unknown_outcomes,
)
