"""ASGI entry point: Django for admin/API, the MCP SDK's app for /mcp.

Django's ASGI handler does not speak the lifespan protocol, and the MCP
session manager needs it, so this dispatcher sends lifespan events and /mcp
to the MCP app and everything else to Django.
"""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "idemops.settings")

django_app = get_asgi_application()

from tools_app.mcp.server import build_app  # noqa: E402  (needs Django set up)

mcp_app = build_app()


async def application(scope, receive, send):
    if scope["type"] == "lifespan" or scope.get("path", "").rstrip("/") == "/mcp":
        await mcp_app(scope, receive, send)
    else:
        await django_app(scope, receive, send)
