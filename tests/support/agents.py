"""Agents calling tools over plain JSON-RPC on HTTP, seeing every status, header and body.

The SDK's client (tests/support/mcp_client.py) turns transport answers into
exceptions; an agent's HTTP layer sees a 503 and its Retry-After. Used by
the outage tests and bench/bench_settle.py.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

import httpx2

# What an agent may be told while an operation has not finished: each says what to do next.
WAITING_CLASSES = {"transient", "in_progress", "unknown_outcome"}


@dataclass
class Answer:
    """One HTTP answer to a tools/call, as an agent sees it."""

    status: int
    headers: dict[str, str]
    body: str
    result: dict[str, Any] | None = None  # the tool result (structuredContent), for 200s
    rpc_error: dict[str, Any] | None = None  # a JSON-RPC error object
    is_error: bool = False
    at: float = 0.0  # time.monotonic() when it arrived

    @property
    def succeeded(self) -> bool:
        return self.result is not None and not self.is_error

    @property
    def error(self) -> dict[str, Any] | None:
        if self.rpc_error is not None:
            return self.rpc_error.get("data")
        return self.result.get("error") if self.is_error and self.result else None

    @property
    def error_class(self) -> str | None:
        return (self.error or {}).get("class")

    def problem(self) -> str | None:
        """Why this answer would leave an agent guessing, or None when it says what to do."""
        if self.succeeded:
            return None
        if self.status == 503:
            if "retry-after" not in self.headers:
                return "503 without Retry-After"
            if not self.headers.get("content-type", "").startswith("application/json"):
                return f"503 as {self.headers.get('content-type')}"
        elif self.status != 200:
            return f"HTTP {self.status} {self.headers.get('content-type')}: {self.body[:200]}"
        if self.error_class not in WAITING_CLASSES:
            return f"no class: {self.body[:300]}"
        if self.error_class == "transient" and not isinstance(self.error.get("retry_after"), (int, float)):
            return f"transient without retry_after: {self.body[:300]}"
        return None

    @property
    def retry_after(self) -> float:
        if "retry-after" in self.headers:
            return float(self.headers["retry-after"])
        return float((self.error or {}).get("retry_after") or 0.5)


def read_answer(response: httpx2.Response) -> Answer:
    answer = Answer(response.status_code, {k.lower(): v for k, v in response.headers.items()}, response.text,
                    at=time.monotonic())
    text = response.text
    if "data: " in text:
        text = text.split("data: ", 1)[1].split("\n", 1)[0]  # stateless Streamable HTTP: one SSE message
    try:
        message = json.loads(text)
    except ValueError:
        return answer  # not JSON at all: problem() names it
    if "error" in message:
        answer.rpc_error = message["error"]
    elif "result" in message:
        answer.result = message["result"].get("structuredContent") or {}
        answer.is_error = bool(message["result"].get("isError"))
    return answer


async def call_tool(client: httpx2.AsyncClient, url: str, token: str, tool: str, arguments: dict) -> Answer:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": tool, "arguments": arguments}}
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream"}
    try:
        return read_answer(await client.post(url, json=body, headers=headers))
    except httpx2.TransportError as exc:  # no answer at all: also a failure to classify
        return Answer(0, {}, f"{type(exc).__name__}: {exc}", at=time.monotonic())


def call_tool_sync(url: str, token: str, tool: str, arguments: dict) -> Answer:
    async def once() -> Answer:
        async with httpx2.AsyncClient(timeout=30) as client:
            return await call_tool(client, url, token, tool, arguments)
    return asyncio.run(once())


async def issued_operation_id(client: httpx2.AsyncClient, url: str, token: str, tool: str, arguments: dict,
                              key: str, answers: list[Answer], deadline: float) -> str:
    """The operation id a high-risk call must carry: prepare_operation (keyed by `key`), asked until answered."""
    prepared = await call_until_done(client, url, token, "prepare_operation",
                                     {"tool": tool, "arguments": arguments, "idempotency_key": key}, answers, deadline)
    return prepared.result["operation_id"]


async def call_until_done(client: httpx2.AsyncClient, url: str, token: str, tool: str, arguments: dict,
                          answers: list[Answer], deadline: float, max_pause: float = 2.0) -> Answer:
    """Call until the operation succeeds, as an agent would: same key, waiting as told (at most `max_pause`)."""
    while True:
        assert time.monotonic() < deadline, f"{tool} {arguments['idempotency_key']} never succeeded: {answers[-3:]}"
        answer = await call_tool(client, url, token, tool, arguments)
        answers.append(answer)
        if answer.succeeded:
            return answer
        await asyncio.sleep(min(answer.retry_after, max_pause) if answer.problem() is None else 0.5)
