"""A local stdio MCP server that any MCP host launches, forwarding to idemops through IdempotentClient.

    idemops-client proxy --url https://idemops.example/mcp --token idm_...

The host sees the remote tools with one change: a write tool's `idempotency_key` argument is left
out of its input schema. A model that follows a schema demanding a key invents a new one at each
re-plan, and a new key is a new operation; so the proxy derives the key itself, and an
`idempotency_key` argument a host sends anyway (one its model made up) is set aside. A key the host
sends in `_meta` (`io.idemops/idempotency-key`) is a deliberate choice of the host, and wins.
Each tools/call goes through `IdempotentClient.call`: a write gets the derived key
(the session is the proxy's `--session`, so a restarted host derives the same keys), an
identical call already done is answered from the ledger, a lost answer is asked again with
the same key, and a high-risk tool gets its server-issued operation id. The ledger is offered
to the model as the resource `idemops://ledger` and the prompt `idemops-ledger`; an answer that
leaves an operation unknown, in progress or waiting for a person says so in words.

Built on the SDK's low-level `Server` rather than `MCPServer`: the tools are the remote
server's, listed with their own schemas, not functions of this process.
"""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path
from typing import Any

import mcp_types as types
from mcp.server import Server, ServerRequestContext
from mcp.server.stdio import stdio_server

from idemops_client.client import META_KEY, CallResult, IdempotentClient
from idemops_client.errors import ToolCallError
from idemops_client.summary import ledger_report, render
from idemops_client.words import LEDGER_URI, error_text, from_ledger_note

LEDGER_PROMPT = "idemops-ledger"
INSTRUCTIONS = (
    "Tools of an idemops server, through a local proxy that makes retries safe. Calling a tool again with "
    "identical arguments never repeats it: the proxy answers from its ledger, or asks the server about the "
    f"same operation. Read the resource {LEDGER_URI} (or the prompt {LEDGER_PROMPT}) to see what was done, "
    "what is unknown and what waits for a person before planning more writes."
)

KEY_ARGUMENT = "idempotency_key"


def package_version() -> str:
    """The installed idemops-client's version, or, run from the source tree, its pyproject's."""
    try:
        return metadata.version("idemops-client")
    except metadata.PackageNotFoundError:
        import tomllib

        with (Path(__file__).parent / "pyproject.toml").open("rb") as pyproject:
            return str(tomllib.load(pyproject)["project"]["version"])


def without_key(tool: types.Tool) -> types.Tool:
    """A write tool as the host's model sees it: the key is the proxy's to derive, not the model's to invent."""
    schema = dict(tool.input_schema or {})
    schema["properties"] = {name: value for name, value in (schema.get("properties") or {}).items()
                            if name != KEY_ARGUMENT}
    if "required" in schema:
        schema["required"] = [name for name in schema["required"] if name != KEY_ARGUMENT]
    return tool.model_copy(update={"input_schema": schema})


class Proxy:
    """The MCP server side of the proxy, serving one IdempotentClient."""

    def __init__(self, client: IdempotentClient):
        self.client = client
        self.server: Server[Any] = Server(
            "idemops-client-proxy", version=package_version(), instructions=INSTRUCTIONS,
            on_list_tools=self._list_tools, on_call_tool=self._call_tool,
            on_list_resources=self._list_resources, on_read_resource=self._read_resource,
            on_list_prompts=self._list_prompts, on_get_prompt=self._get_prompt)

    async def serve_stdio(self) -> None:
        async with stdio_server() as (read_stream, write_stream):
            await self.server.run(read_stream, write_stream, self.server.create_initialization_options())

    # --- tools --------------------------------------------------------------------------------

    async def _list_tools(self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
                          ) -> types.ListToolsResult:
        listing = await self.client.listing()
        writes = {name for name, info in (await self.client.tools()).items() if info.writes}
        return listing.model_copy(update={"tools": [without_key(tool) if tool.name in writes else tool
                                                    for tool in listing.tools]})

    async def _call_tool(self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
                         ) -> types.CallToolResult:
        meta = dict(ctx.meta or {}) if ctx.meta is not None else {}
        key = meta.get(META_KEY)
        arguments = dict(params.arguments or {})
        tools = await self.client.tools()
        if params.name in tools and tools[params.name].writes:
            # Not in the schema the host was shown: a model's invention, fresh at every re-plan.
            arguments.pop(KEY_ARGUMENT, None)
        try:
            result = await self.client.call(params.name, arguments, key=key if isinstance(key, str) else None)
        except ToolCallError as error:
            return error_result(error)
        return tool_result(result)

    # --- the ledger, for the model ------------------------------------------------------------

    async def _list_resources(self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
                              ) -> types.ListResourcesResult:
        return types.ListResourcesResult(resources=[types.Resource(
            uri=LEDGER_URI, name="idemops-ledger", title="Tool calls of this session",
            description="What was done, what is unknown, what waits for a person (the proxy's ledger).",
            mime_type="text/markdown")])

    async def _read_resource(self, ctx: ServerRequestContext[Any], params: types.ReadResourceRequestParams
                             ) -> types.ReadResourceResult:
        if str(params.uri) != LEDGER_URI:
            raise ValueError(f"no resource {params.uri}; this proxy serves {LEDGER_URI}")
        text = ledger_report(self.client.ledger.entries())
        return types.ReadResourceResult(contents=[types.TextResourceContents(
            uri=LEDGER_URI, mime_type="text/markdown", text=text)])

    async def _list_prompts(self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
                            ) -> types.ListPromptsResult:
        return types.ListPromptsResult(prompts=[types.Prompt(
            name=LEDGER_PROMPT, title="What this session's tool calls did",
            description="The ledger of tool calls with side effects, and how to treat unfinished ones.")])

    async def _get_prompt(self, ctx: ServerRequestContext[Any], params: types.GetPromptRequestParams
                          ) -> types.GetPromptResult:
        if params.name != LEDGER_PROMPT:
            raise ValueError(f"no prompt {params.name!r}; this proxy serves {LEDGER_PROMPT!r}")
        entries = self.client.ledger.entries()
        text = ledger_report(entries) + "\n\n" + render(entries)
        return types.GetPromptResult(description="The tool calls of this session", messages=[
            types.PromptMessage(role="user", content=types.TextContent(type="text", text=text))])


def tool_result(result: CallResult) -> types.CallToolResult:
    """The server's own result when there was a round trip; the recorded one, said so, from the ledger."""
    if result.raw is not None and not result.from_ledger:
        return result.raw
    answer = types.CallToolResult(
        content=[types.TextContent(type="text", text=from_ledger_note(result)),
                 types.TextContent(type="text", text=json.dumps(result.structured, ensure_ascii=False))],
        structured_content=result.structured)
    answer.meta = {"io.idemops/replayed": True, "io.idemops/from-ledger": True}
    return answer


def error_result(error: ToolCallError) -> types.CallToolResult:
    return types.CallToolResult(is_error=True, content=[types.TextContent(type="text", text=error_text(error))],
                                structured_content={"error": error.error, "idempotency_key": error.key,
                                                    "trace_id": error.trace_id})
