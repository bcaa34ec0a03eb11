"""Test-only tools for the official MCP conformance suite (@modelcontextprotocol/conformance), served only
with IDEMOPS_CONFORMANCE_TEST_TOOLS on (production refuses it: tools_app/conf/fields.py).

The suite's tool scenarios call tools by fixed names (`test_simple_text`, `test_error_handling`, ...) and
check what the MCP layer does with them: content blocks, an error result, log and progress
notifications on the call's stream, a JSON Schema 2020-12 input schema kept as written, and requests to
the client (sampling, elicitation). They are not registry tools: they take no key, touch no table and
run no engine; the MCP server (tools_app.mcp.server) adds them as plain SDK tools, with a
`logging/setLevel` handler (which declares the `logging` capability, as the suite's logging scenarios need). Each tool
does what the suite's scenario text asks of it (tests/interop/node_modules/@modelcontextprotocol/
conformance/dist/index.js), nothing more.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

from mcp.server.context import ServerRequestContext
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.tools.base import Tool
from mcp.server.mcpserver.utilities.func_metadata import ArgModelBase, FuncMetadata
from mcp_types import (
    AudioContent,
    CallToolResult,
    ContentBlock,
    EmbeddedResource,
    ImageContent,
    SamplingMessage,
    SetLevelRequestParams,
    TextContent,
    TextResourceContents,
)
from pydantic import ConfigDict

# A 1x1 red PNG, and a WAV of one silent sample (8 kHz, 8-bit mono): the smallest valid ones.
PNG = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==")
WAV = "UklGRiUAAABXQVZFZm10IBAAAAABAAEAQB8AAEAfAAABAAgAZGF0YQEAAACA"
RESOURCE = EmbeddedResource(type="resource", resource=TextResourceContents(
    uri="test://embedded-resource", mime_type="text/plain", text="This is an embedded resource content."))
SCHEMA_2020_12 = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "$defs": {"address": {"type": "object", "properties": {"street": {"type": "string"}, "city": {"type": "string"}}}},
    "properties": {"name": {"type": "string"}, "address": {"$ref": "#/$defs/address"}},
    "additionalProperties": False,
}
DEFAULTS_SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "default": "John Doe"},
    "age": {"type": "integer", "default": 30},
    "score": {"type": "number", "default": 95.5},
    "status": {"type": "string", "enum": ["active", "inactive", "pending"], "default": "active"},
    "verified": {"type": "boolean", "default": True},
}}
ENUMS_SCHEMA = {"type": "object", "properties": {
    "untitledSingle": {"type": "string", "enum": ["option1", "option2", "option3"]},
    "titledSingle": {"type": "string", "oneOf": [{"const": "value1", "title": "First Option"},
                                                 {"const": "value2", "title": "Second Option"},
                                                 {"const": "value3", "title": "Third Option"}]},
    "legacyEnum": {"type": "string", "enum": ["opt1", "opt2", "opt3"],
                   "enumNames": ["Option One", "Option Two", "Option Three"]},
    "untitledMulti": {"type": "array", "items": {"type": "string", "enum": ["option1", "option2", "option3"]}},
    "titledMulti": {"type": "array", "items": {"anyOf": [{"const": "value1", "title": "First Choice"},
                                                         {"const": "value2", "title": "Second Choice"},
                                                         {"const": "value3", "title": "Third Choice"}]}},
}}
USER_SCHEMA = {"type": "object", "required": ["username", "email"], "properties": {
    "username": {"type": "string", "description": "User's response"},
    "email": {"type": "string", "description": "User's email address"}}}
STEP_SECONDS = 0.05  # the pause the logging and progress scenarios ask for between notifications


def text(words: str) -> list[ContentBlock]:
    return [TextContent(type="text", text=words)]


async def test_simple_text() -> CallToolResult:
    return CallToolResult(content=text("This is a simple text response for testing."))


async def test_image_content() -> CallToolResult:
    return CallToolResult(content=[ImageContent(type="image", data=PNG, mime_type="image/png")])


async def test_audio_content() -> CallToolResult:
    return CallToolResult(content=[AudioContent(type="audio", data=WAV, mime_type="audio/wav")])


async def test_embedded_resource() -> CallToolResult:
    return CallToolResult(content=[RESOURCE])


async def test_multiple_content_types() -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text="Multiple content types test:"),
                                   ImageContent(type="image", data=PNG, mime_type="image/png"), RESOURCE])


async def test_error_handling() -> CallToolResult:
    return CallToolResult(content=text("This tool intentionally returns an error for testing"), is_error=True)


async def test_tool_with_logging(ctx: Context) -> CallToolResult:
    for step, message in enumerate(("Tool execution started", "Tool processing data", "Tool execution completed")):
        if step:
            await asyncio.sleep(STEP_SECONDS)
        await ctx.info(message)
    return CallToolResult(content=text("Tool with logging executed successfully"))


async def test_tool_with_progress(ctx: Context) -> CallToolResult:
    for step, progress in enumerate((0, 50, 100)):
        if step:
            await asyncio.sleep(STEP_SECONDS)
        await ctx.report_progress(progress, 100)
    return CallToolResult(content=text("Tool with progress executed successfully"))


async def test_sampling(prompt: str, ctx: Context) -> CallToolResult:
    answer = await ctx.session.create_message(  # deprecated at 2026-07-28; the scenario is 2025-11-25's
        [SamplingMessage(role="user", content=TextContent(type="text", text=prompt))], max_tokens=100,
        related_request_id=ctx.request_id)
    content = answer.content
    said = content.text if isinstance(content, TextContent) else json.dumps(content.model_dump(mode="json"))
    return CallToolResult(content=text(f"LLM response: {said}"))


async def elicit(ctx: Context, message: str, schema: dict[str, Any], prefix: str) -> CallToolResult:
    answer = await ctx.session.elicit_form(message, schema, related_request_id=ctx.request_id)
    return CallToolResult(content=text(f"{prefix}action={answer.action}, content={json.dumps(answer.content)}"))


async def test_elicitation(message: str, ctx: Context) -> CallToolResult:
    return await elicit(ctx, message, USER_SCHEMA, "User response: ")


async def test_elicitation_sep1034_defaults(ctx: Context) -> CallToolResult:
    return await elicit(ctx, "Please review and update the form fields with defaults", DEFAULTS_SCHEMA,
                        "Elicitation completed: ")


async def test_elicitation_sep1330_enums(ctx: Context) -> CallToolResult:
    return await elicit(ctx, "Please select options from the enum fields", ENUMS_SCHEMA, "Elicitation completed: ")


class _AnyArguments(ArgModelBase):
    model_config = ConfigDict(extra="allow")


async def json_schema_2020_12_tool(**arguments: Any) -> CallToolResult:
    return CallToolResult(content=text(f"Received: {json.dumps(arguments)}"))


def schema_tool() -> Tool:
    """The 2020-12 tool: its input schema exactly as the scenario writes it (the SDK's own would be pydantic's)."""
    return Tool(fn=json_schema_2020_12_tool, name="json_schema_2020_12_tool",
                description="Tool with JSON Schema 2020-12 features", parameters=SCHEMA_2020_12, is_async=True,
                fn_metadata=FuncMetadata(arg_model=_AnyArguments), title=None, context_kwarg=None, annotations=None)


TOOLS: list[Callable[..., Awaitable[CallToolResult]]] = [
    test_simple_text, test_image_content, test_audio_content, test_embedded_resource, test_multiple_content_types,
    test_error_handling, test_tool_with_logging, test_tool_with_progress, test_sampling, test_elicitation,
    test_elicitation_sep1034_defaults, test_elicitation_sep1330_enums]
NAMES = frozenset([tool.__name__ for tool in TOOLS] + ["json_schema_2020_12_tool"])


def tools() -> list[Tool]:
    return [*(Tool.from_function(tool, description=f"Conformance test tool ({tool.__name__}).") for tool in TOOLS),
            schema_tool()]


async def set_level(ctx: ServerRequestContext[Any, Any], params: SetLevelRequestParams) -> dict[str, Any]:
    """Every level is sent (the test tools log at info): the level is acknowledged, not kept."""
    return {}


def serve_logging_level(server: MCPServer) -> None:
    """`logging/setLevel`, and with it the `logging` capability. MCPServer has no public way to add it (the
    2026-07-28 revision removed the method); the SDK's own advice is its low-level server's
    add_request_handler."""
    server._lowlevel_server.add_request_handler("logging/setLevel", SetLevelRequestParams, set_level)
