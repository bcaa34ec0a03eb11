"""The official SDK's MCP client over real HTTP, for tests."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult


@asynccontextmanager
async def connect(url: str, token: str | None) -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx2.AsyncClient(headers=headers, timeout=30) as http:
        async with Client(streamable_http_client(url, http_client=http), mode="legacy") as client:
            yield client


async def call(url: str, token: str, tool: str, arguments: dict[str, Any], **kwargs: Any) -> CallToolResult:
    """One call on a fresh connection, as a retrying agent would make it."""
    async with connect(url, token) as client:
        return await client.call_tool(tool, arguments, **kwargs)


def call_sync(url: str, token: str, tool: str, arguments: dict[str, Any], **kwargs: Any) -> CallToolResult:
    return asyncio.run(call(url, token, tool, arguments, **kwargs))


def error_of(result: CallToolResult) -> dict[str, Any]:
    assert result.is_error, f"expected an error, got {result.structured_content}"
    return result.structured_content["error"]
