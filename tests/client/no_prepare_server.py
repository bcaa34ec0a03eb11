"""A server of another make for the client's tests: the bare `mcp` SDK, one high-risk tool `pay` that
takes only operation ids the server issued, and no `prepare_operation` to issue one. It counts the
calls it receives (`calls`, a read), so a test sees how many requests reached the tool.

    python -m uvicorn tests.client.no_prepare_server:app --port 8101
"""

from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.transport_security import TransportSecuritySettings
from mcp.types import CallToolResult, TextContent, ToolAnnotations

KEY_META = "io.idemops/idempotency-key"
server = MCPServer(name="no-prepare")
received: list[str] = []


@server.tool(meta={"io.idemops/requires-operation-id": True}, annotations=ToolAnnotations(readOnlyHint=False))
async def pay(amount: str, ctx: Context) -> CallToolResult:
    """Pays; the key (in `_meta`) must be an operation id this server issued (it issues none)."""
    received.append(str((ctx.request_context.meta or {}).get(KEY_META)))
    error: dict[str, Any] = {"class": "invalid_input", "operation_id_required": True,
                             "message": "pay takes only operation ids this server issued"}
    return CallToolResult(content=[TextContent(type="text", text=error["message"])],
                          structured_content={"error": error}, is_error=True)


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
async def calls() -> dict[str, Any]:
    """The keys `pay` received, in order."""
    return {"keys": list(received)}


app = server.streamable_http_app(
    streamable_http_path="/mcp", stateless_http=True,
    transport_security=TransportSecuritySettings(allowed_hosts=["127.0.0.1:*"], allowed_origins=["http://127.0.0.1:*"]))
