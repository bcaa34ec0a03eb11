"""ASGI entry point: Django for admin/API, the MCP SDK's app for /mcp and /mcp/session.

Django's ASGI handler does not speak the lifespan protocol, and the MCP
session manager needs it, so this dispatcher sends lifespan events and /mcp
to the MCP app and everything else to Django.
"""

import gc
import os
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from django.core.asgi import get_asgi_application
from django.db import connections

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "idemops.settings")

django_app = get_asgi_application()

from tools_app.mcp.server import build_app  # noqa: E402  (needs Django set up)
from tools_app.tasks.versions import refuse_stranded  # noqa: E402

# A deploy whose pipelines cannot run some unfinished task's version does not start (docs/tasks.md).
refuse_stranded()

mcp_app = build_app()
# What start-up read went through this thread's connection, which no request's end closes: hand it back
# (to its pool, with IDEMOPS_DB_POOL_MAX_SIZE, where this thread would otherwise hold one of the pool's
# connections for the process's life, and a pool of one would serve no request).
connections.close_all()
# /mcp (stateless) and /mcp/session (stateful sessions, for hosts at 2025-11-25 asked mid-call).
MCP_PATHS = ("/mcp", "/mcp/session")


# What start-up built (Django, the SDK, the tools: over 200,000 objects) lives as long as the process:
# kept out of the cyclic collector's walks, so that a full collection, which requests' garbage sets off
# every few thousand calls, does not walk it all for nothing each time (a pause of about 100 ms).
gc.collect()
gc.freeze()


# Types both apps accept: Django's handler wants a dict scope, the OpenTelemetry middleware mutable mappings.
async def application(scope: dict[str, Any], receive: Callable[[], Awaitable[dict[str, Any]]],
                      send: Callable[[Mapping[str, Any]], Awaitable[None]]) -> None:
    if scope["type"] == "lifespan" or scope.get("path", "").rstrip("/") in MCP_PATHS:
        await mcp_app(scope, receive, send)
    else:
        await django_app(scope, receive, send)
