"""Pydantic AI: idemops tools as `Tool`s, the ledger in the agent's instructions.

    async with IdempotentClient(url, token, ledger=Ledger("calls.sqlite"), session_id="chat-42") as client:
        agent = Agent(model, tools=await idemops_tools(client), instructions=ledger_instructions(client))
        await agent.run("Order 3 bolts for ACME")
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic_ai import Tool

from idemops_client.client import IdempotentClient
from idemops_client.errors import ToolCallError
from idemops_client.words import error_text, result_text


async def idemops_tools(client: IdempotentClient, names: set[str] | None = None) -> list[Tool[Any]]:
    """The server's tools (or those named) as Pydantic AI tools calling through `client`."""
    listing = await client.listing()
    return [tool(client, t.name, t.description or "", dict(t.input_schema))
            for t in listing.tools if names is None or t.name in names]


def tool(client: IdempotentClient, name: str, description: str, schema: dict[str, Any]) -> Tool[Any]:
    async def invoke(**arguments: Any) -> str:
        try:
            return result_text(await client.call(name, arguments))
        except ToolCallError as error:
            return error_text(error)

    return Tool.from_schema(invoke, name=name, description=description, json_schema=schema)


def ledger_instructions(client: IdempotentClient, base: str = "") -> Callable[[], str]:
    """Instructions read anew on every model request: `base`, then the ledger's summary."""

    def instructions() -> str:
        return "\n\n".join(part for part in (base, client.ledger.summary_for_model()) if part)

    return instructions
