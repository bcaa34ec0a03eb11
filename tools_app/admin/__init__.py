"""The operators' admin, one module per concept."""

from tools_app.admin import audit, auditors, business, records, tenants  # noqa: F401
