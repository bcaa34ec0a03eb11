"""The tools. Importing this package registers every tool (see tools_app.registry)."""

from tools_app.tools import (  # noqa: F401
    announcements,
    approvals,
    deletion,
    documents,
    identity,
    notifications,
    onboarding,
    orders,
    payments,
    task_tools,
    ticket_batch,
    tickets,
)
