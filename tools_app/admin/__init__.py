"""The operators' admin, one module per concept."""

from tools_app.admin import approvals, audit, business, dashboard, records, tenants  # noqa: F401
