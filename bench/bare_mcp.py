"""The anchor of P4 and P4b: the bare `mcp` SDK serving a no-op tool. No Django, no auth, no database.

The same SDK and transport idemops uses (`MCPServer`, stateless Streamable HTTP at /mcp), with one
async tool that returns at once. Served by bench/bench_mcp.py with the same ASGI server and the
same load generator as idemops:

    .venv/bin/python -m uvicorn bench.bare_mcp:app --port 8100
    .venv/bin/granian --interface asgi bench.bare_mcp:app --port 8100
"""

from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.transport_security import TransportSecuritySettings

server = MCPServer(name="bare")


@server.tool()
async def noop() -> dict[str, Any]:
    """Does nothing."""
    return {"ok": True}


app = server.streamable_http_app(
    streamable_http_path="/mcp", stateless_http=True,
    transport_security=TransportSecuritySettings(allowed_hosts=["127.0.0.1:*", "localhost:*"],
                                                 allowed_origins=["http://127.0.0.1:*"]))
