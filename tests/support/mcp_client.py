"""The official SDK's MCP client over real HTTP, for tests."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Literal

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult, Request, RequestParams
from pydantic import ConfigDict


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


# --- raw JSON-RPC over HTTP, for what the SDK's client would never send ----------------------------


def post_raw(url: str, token: str, message: Any) -> httpx2.Response:
    """POST one JSON-RPC message as bytes, exactly as given (any id, any arguments)."""
    return httpx2.post(url, content=json.dumps(message), timeout=30, headers={
        "Authorization": f"Bearer {token}", "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-06-18"})


def answer_of(response: httpx2.Response) -> dict[str, Any]:
    """The JSON-RPC answer in a response: the JSON body, or the last `data:` event of an SSE stream."""
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        events = [line[len("data:"):].strip() for line in response.text.splitlines() if line.startswith("data:")]
        return json.loads(events[-1])
    return response.json()


def raw_call(url: str, token: str, tool: str, arguments: Any, request_id: Any = 1) -> dict[str, Any]:
    """tools/call with raw arguments; returns the JSON-RPC answer."""
    response = post_raw(url, token, {"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
                                     "params": {"name": tool, "arguments": arguments}})
    assert response.status_code == 200, response.text
    return answer_of(response)


def raw_error_of(answer: dict[str, Any]) -> dict[str, Any]:
    """The classified error of a raw tools/call answer that is an isError result."""
    result = answer["result"]
    assert result["isError"], f"expected an error, got {result}"
    return result["structuredContent"]["error"]


# --- the 2026-07-28 tasks extension's subscriptions/listen, which the SDK has no method for --------------


class TaskPush(RequestParams):
    """A `notifications/tasks` frame: the task as tasks/get shows it (every field kept)."""

    model_config = ConfigDict(extra="allow")
    task_id: str
    status: str


class ListenParams(RequestParams):
    notifications: dict[str, Any]


class Listen(Request[ListenParams, Literal["subscriptions/listen"]]):
    method: Literal["subscriptions/listen"] = "subscriptions/listen"
    params: ListenParams
