"""The tools. Importing this package registers every tool (see tools_app.registry)."""

from tools_app.tools import identity, notifications, orders, payments, tickets  # noqa: F401
