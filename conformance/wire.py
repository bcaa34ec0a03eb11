"""Raw JSON-RPC over Streamable HTTP, at either protocol revision, with httpx2 only.

Raw, not the SDK's client, because the suite must do what a well-behaved client never does on purpose:
abandon a request mid-stream and issue it again, send a malformed key, fire a storm at once.

- 2025-11-25 (and older): `initialize`, then `notifications/initialized`, then requests carrying the
  `Mcp-Session-Id` the server gave (if any) and the `MCP-Protocol-Version` header.
- 2026-07-28: no handshake; every request carries the protocol version, client info and capabilities
  in its `_meta`, and the `Mcp-Method` / `Mcp-Name` headers.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from typing import Any

import httpx2

LEGACY, MODERN = "2025-11-25", "2026-07-28"
EXTENSION = "io.idemops/idempotency"
CLIENT_INFO = {"name": "idempotency-conformance", "version": "1.0.0"}
_ids = itertools.count(1)


class WireError(Exception):
    """A JSON-RPC error answer (not a tool's isError result)."""

    def __init__(self, error: dict[str, Any]):
        super().__init__(f"{error.get('code')}: {error.get('message')}")
        self.error = error


def parse_answer(response: httpx2.Response) -> dict[str, Any]:
    """The JSON-RPC answer in a response: a JSON body, or the last `data:` event of an SSE stream."""
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        events = [line[5:].strip() for line in response.text.splitlines() if line.startswith("data:")]
        events = [event for event in events if event]
        answer: dict[str, Any] = json.loads(events[-1])
        return answer
    body: dict[str, Any] = response.json()
    return body


@dataclass
class Connection:
    url: str
    token: str | None
    version: str = LEGACY
    session_id: str | None = None
    capabilities: dict[str, Any] = field(default_factory=dict)
    protocol: str | None = None
    http: httpx2.AsyncClient | None = None

    async def __aenter__(self) -> Connection:
        self.http = httpx2.AsyncClient(timeout=60)
        if self.version == LEGACY:
            result = await self.request("initialize", {"protocolVersion": self.version, "clientInfo": CLIENT_INFO,
                                                       "capabilities": {"extensions": {EXTENSION: {}}}})
            self.capabilities = result.get("capabilities") or {}
            self.protocol = result.get("protocolVersion")
            await self.post({"jsonrpc": "2.0", "method": "notifications/initialized"})
        else:
            self.capabilities = (await self.request("server/discover", {})).get("capabilities") or {}
            self.protocol = self.version
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.http is not None
        await self.http.aclose()

    def advertisement(self) -> dict[str, Any] | None:
        """The extension's settings: `capabilities.extensions`, or at 2025-11-25 `capabilities.experimental`."""
        for place in ("extensions", "experimental"):
            settings = (self.capabilities.get(place) or {}).get(EXTENSION)
            if isinstance(settings, dict):
                return settings
        return None

    def headers(self, message: dict[str, Any]) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
                   "MCP-Protocol-Version": self.version}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        if self.session_id:
            headers["Mcp-Session-Id"] = self.session_id
        if self.version == MODERN and "method" in message:
            headers["Mcp-Method"] = message["method"]
            name = (message.get("params") or {}).get("name")
            if message["method"] == "tools/call" and isinstance(name, str):
                headers["Mcp-Name"] = name
        return headers

    def message(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        params = json.loads(json.dumps(params))
        if self.version == MODERN:
            params.setdefault("_meta", {}).update({
                "io.modelcontextprotocol/protocolVersion": self.version,
                "io.modelcontextprotocol/clientInfo": CLIENT_INFO,
                "io.modelcontextprotocol/clientCapabilities": {"extensions": {EXTENSION: {}}}})
        return {"jsonrpc": "2.0", "id": next(_ids), "method": method, "params": params}

    async def post(self, message: dict[str, Any]) -> httpx2.Response:
        assert self.http is not None
        response = await self.http.post(self.url, content=json.dumps(message), headers=self.headers(message))
        if response.headers.get("mcp-session-id"):
            self.session_id = response.headers["mcp-session-id"]
        return response

    async def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        response = await self.post(self.message(method, params))
        if response.status_code != 200:
            raise WireError({"code": response.status_code, "message": response.text[:300]})
        answer = parse_answer(response)
        if "error" in answer:
            raise WireError(answer["error"])
        result: dict[str, Any] = answer["result"]
        return result

    async def abandon(self, message: dict[str, Any], after_bytes: int = 0) -> None:
        """Send a request and break its stream: close the connection having read at most `after_bytes`."""
        assert self.http is not None
        async with self.http.stream("POST", self.url, content=json.dumps(message),
                                    headers=self.headers(message)) as response:
            read = 0
            async for chunk in response.aiter_raw():
                read += len(chunk)
                if read >= after_bytes:
                    break

    def call_message(self, tool: str, arguments: dict[str, Any], key: str | None = None) -> dict[str, Any]:
        params: dict[str, Any] = {"name": tool, "arguments": arguments}
        if key is not None:
            params["_meta"] = {"io.idemops/idempotency-key": key}
        return self.message("tools/call", params)

    async def call(self, tool: str, arguments: dict[str, Any], key: str | None = None) -> dict[str, Any]:
        """tools/call; the CallToolResult (a tool error is a result with isError, not an exception)."""
        params = self.call_message(tool, arguments, key)["params"]
        return await self.request("tools/call", params)

    async def tools(self) -> list[dict[str, Any]]:
        tools: list[dict[str, Any]] = []
        cursor: str | None = None
        while True:
            page = await self.request("tools/list", {"cursor": cursor} if cursor else {})
            tools += page.get("tools") or []
            cursor = page.get("nextCursor")
            if not cursor:
                return tools
