"""The operators' admin, one module per concept."""

from tools_app.admin import audit, business, outbox, records, tenants, unknown_outcomes  # noqa: F401
