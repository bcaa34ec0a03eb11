"""The tools. Importing this package registers every tool (see tools_app.registry)."""

from tools_app.tools import documents, orders, task_tools, tickets  # noqa: F401
