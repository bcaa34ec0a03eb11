"""The platform's own tools: task tools, scheduled operations, prepare_operation / get_operation, approval status,
whoami.

An app's tools (the demo's orders, payments, documents...) are declared in its own `idemops_tools`
module with the public tool API (`idemops.tools`) and found at start-up (`discover`).

Importing this package registers the platform's tools (see tools_app.toolkit.registry). May import:
toolkit and the concept packages (approvals, reconciliation, outbox, tasks, scheduling), core, access and engine.
"""

from __future__ import annotations

import importlib

from django.utils.module_loading import autodiscover_modules

from tools_app.tools import (  # noqa: F401
    approvals,
    identity,
    operations,
    scheduling_tools,
    task_tools,
)

# The module every installed app may have (as `admin.py` for the admin) that declares its tools.
TOOLS_MODULE = "idemops_tools"


def discover(modules: list[str]) -> None:
    """Import each installed app's `idemops_tools` module, then each module `IDEMOPS_TOOL_MODULES` names.

    A module's declarations register as it is imported; a declaration the registry refuses raises
    naming the module it came from (toolkit.registry.register)."""
    autodiscover_modules(TOOLS_MODULE)
    for name in modules:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as missing:
            if missing.name is not None and name.startswith(missing.name):
                raise ImportError(f"IDEMOPS_TOOL_MODULES names {name!r}, which cannot be imported") from missing
            raise
