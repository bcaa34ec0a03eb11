"""The demo's tools: importing each module declares its tools (found at start-up like `admin.py`)."""

from idemops_demo.tools import (  # noqa: F401
    announcements,
    deletion,
    documents,
    notifications,
    onboarding,
    orders,
    payments,
    ticket_batch,
    tickets,
)
