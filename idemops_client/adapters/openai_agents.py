"""The OpenAI Agents SDK: idemops tools as `FunctionTool`s, the ledger in the agent's instructions.

    async with IdempotentClient(url, token, ledger=Ledger("calls.sqlite"), session_id="chat-42") as client:
        agent = Agent(name="clerk", instructions=ledger_instructions(client, "You place orders."),
                      tools=await idemops_tools(client))
        await Runner.run(agent, "Order 3 bolts for ACME")
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from agents import Agent, FunctionTool, RunContextWrapper
from agents.tool_context import ToolContext

from idemops_client.client import IdempotentClient
from idemops_client.errors import ToolCallError
from idemops_client.words import error_text, result_text


async def idemops_tools(client: IdempotentClient, names: set[str] | None = None) -> list[FunctionTool]:
    """The server's tools (or those named) as FunctionTools calling through `client`."""
    listing = await client.listing()
    return [function_tool(client, tool.name, tool.description or "", dict(tool.input_schema))
            for tool in listing.tools if names is None or tool.name in names]


def function_tool(client: IdempotentClient, name: str, description: str, schema: dict[str, Any]) -> FunctionTool:
    async def invoke(context: ToolContext[Any], arguments: str) -> str:
        try:
            return result_text(await client.call(name, json.loads(arguments or "{}")))
        except ToolCallError as error:
            return error_text(error)

    # Not strict: the server's schemas have optional fields, which strict mode forbids.
    return FunctionTool(name=name, description=description, params_json_schema=schema, on_invoke_tool=invoke,
                        strict_json_schema=False)


Instructions = Callable[[RunContextWrapper[Any], Agent[Any]], str]


def ledger_instructions(client: IdempotentClient, base: str = "") -> Instructions:
    """Dynamic instructions: `base`, then the ledger's summary, read anew on every model turn."""

    def instructions(context: RunContextWrapper[Any], agent: Agent[Any]) -> str:
        return "\n\n".join(part for part in (base, client.ledger.summary_for_model()) if part)

    return instructions
