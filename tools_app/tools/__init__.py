"""The tools. Importing this package registers every tool (see tools_app.registry)."""

from tools_app.tools import announcements, approvals, deletion, orders, tickets  # noqa: F401
