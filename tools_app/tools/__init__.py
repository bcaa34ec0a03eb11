"""The tools, one declaration each, and the business objects they create (models.py).

Importing this package registers every tool (see tools_app.toolkit.registry). May import:
toolkit and the concept packages (approvals, reconciliation, outbox, tasks, documents), core,
access and engine.
"""

from tools_app.tools import (  # noqa: F401
    announcements,
    approvals,
    deletion,
    documents,
    identity,
    notifications,
    operations,
    orders,
    payments,
    task_tools,
    tickets,
)
