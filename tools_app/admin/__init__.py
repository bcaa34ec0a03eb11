"""The operators' admin, one module per concept."""

from tools_app.admin import audit, business, records, tasks, tenants  # noqa: F401
