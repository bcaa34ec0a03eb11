"""A deliberately broken server, to show the suite can fail: `python -m conformance.broken_server --port N`.

The bare `mcp` SDK (MCPServer over Streamable HTTP, stateful, everything in memory) claiming
`io.idemops/idempotency`: it advertises the extension, declares `create_order` and `ingest_document` as
taking a key, and answers `get_operation`. Each defect below is one a real implementation makes, and each
can be switched on alone (`--defect NAME`, repeatable; `--defect none` for a server with none of them):

- `double-write`: keys are remembered per MCP session, so the same key on another connection runs the
  write again (the storm's separate connections make N orders);
- `no-replay-marker`: a replay is answered with the stored result but marked `replayed: false`;
- `conflict-without-fields`: other arguments under a used key answer `conflict` without `differing_fields`;
- `in-progress-without-handle`: a call of a running operation answers `in_progress` without the
  operation's handle (and so without a way to ask `get_operation` about it).

docs/extension/idempotency.md section 12 says which scenario catches which defect, and
tests/conformance/test_the_suite_fails_a_broken_server.py shows each scenario failing it. With
`--defect none` it passes those same scenarios: a scenario fails because of its defect, not because
the server is bare.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import Extension
from mcp.server.mcpserver import Context, MCPServer
from mcp_types import CallToolResult, TextContent

IDENTIFIER = "io.idemops/idempotency"
KEY_META, REPLAYED_META = "io.idemops/idempotency-key", "io.idemops/replayed"
KEY_PATTERN = re.compile(r"[A-Za-z0-9._:-]{1,255}")
DEFECTS = ("double-write", "no-replay-marker", "conflict-without-fields", "in-progress-without-handle")
SETTINGS = {"version": "2026-12-01", "keyMeta": KEY_META, "keyArgument": "idempotency_key",
            "keyPattern": KEY_PATTERN.pattern, "replayedMeta": REPLAYED_META, "expiresMeta": "io.idemops/expires-at",
            "getOperationTool": "get_operation", "prepareOperationTool": "prepare_operation"}
DECLARATION = {"key": "required", "requiresOperationId": False, "nonBusinessFields": [], "retentionSeconds": 86400,
               "afterRetention": "new_operation"}
INGEST_SECONDS = 2.0  # how long an ingest runs: long enough for the in-progress scenario's second call


@dataclass
class Operation:
    operation_id: str
    arguments: dict[str, Any]
    result: dict[str, Any] | None = None  # None while it runs


@dataclass
class Store:
    defects: frozenset[str]
    operations: dict[tuple[str, str, str], Operation] = field(default_factory=dict)
    orders: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    running: set[asyncio.Task[None]] = field(default_factory=set)

    def scope(self, ctx: Context) -> str:
        # The double write: a key is looked up in the caller's MCP session only.
        return (ctx.headers or {}).get("mcp-session-id", "") if "double-write" in self.defects else ""

    def by_id(self, operation_id: str) -> Operation | None:
        return next((op for op in self.operations.values() if op.operation_id == operation_id), None)

    def claim(self, ctx: Context, tool: str, arguments: dict[str, Any]
              ) -> tuple[Operation | None, CallToolResult | None]:
        """The operation to run (new), or the answer for a key already used."""
        key = (ctx.request_context.meta or {}).get(KEY_META)
        if not isinstance(key, str) or not KEY_PATTERN.fullmatch(key):
            return None, error("invalid_input", f"the key must match {KEY_PATTERN.pattern}")
        found = self.operations.get((self.scope(ctx), tool, key))
        if found is None:
            op = Operation(uuid.uuid4().hex, arguments)
            self.operations[(self.scope(ctx), tool, key)] = op
            return op, None
        if found.arguments != arguments:
            fields = {} if "conflict-without-fields" in self.defects else {"differing_fields": differing(
                found.arguments, arguments)}
            return None, error("conflict", "the key was used with other arguments", **fields)
        if found.result is None:
            return None, self.running_answer(found)
        return None, answer(found, replayed="no-replay-marker" not in self.defects)

    def running_answer(self, op: Operation) -> CallToolResult:
        """A call of a running operation: in_progress, with the operation's handle."""
        handle = {} if "in-progress-without-handle" in self.defects else {
            "operation_id": op.operation_id, "idempotency": {"operation_id": op.operation_id}}
        return error("in_progress", "the operation is running; ask again with the same key", retry_after=1, **handle)


def error(kind: str, message: str, **details: Any) -> CallToolResult:
    block = {"error": {"class": kind, "message": message, **{k: v for k, v in details.items() if k != "idempotency"}}}
    if "idempotency" in details:
        block["idempotency"] = details["idempotency"]
    return CallToolResult(content=[TextContent(type="text", text=f"{kind}: {message}")], structured_content=block,
                          is_error=True)


def answer(op: Operation, replayed: bool) -> CallToolResult:
    assert op.result is not None
    body = {**op.result, "idempotency": {"operation_id": op.operation_id, "replayed": replayed}}
    return CallToolResult(content=[TextContent(type="text", text=json.dumps(body))], structured_content=body,
                          _meta={REPLAYED_META: replayed})


def differing(first: dict[str, Any], other: dict[str, Any]) -> list[str]:
    return sorted(name for name in set(first) | set(other) if first.get(name) != other.get(name))


def build(defects: frozenset[str]) -> MCPServer:
    store = Store(defects)

    async def create_order(customer: str, currency: str, items: list[dict[str, Any]], ctx: Context) -> CallToolResult:
        """Create an order (takes an idempotency key in _meta)."""
        op, done = store.claim(ctx, "create_order", {"customer": customer, "currency": currency, "items": items})
        if op is None:
            assert done is not None
            return done
        total = sum(float(item.get("unit_price", 0)) * int(item.get("quantity", 1)) for item in items)
        op.result = {"order_id": next(store.orders), "customer": customer, "total": f"{total:.2f}"}
        return answer(op, replayed=False)

    async def ingest_document(text: str, ctx: Context) -> CallToolResult:
        """Ingest a document: runs a while, answering in_progress meanwhile (takes a key in _meta)."""
        op, done = store.claim(ctx, "ingest_document", {"text": text})
        if op is None:
            assert done is not None
            return done

        async def ingest(op: Operation = op) -> None:
            await asyncio.sleep(INGEST_SECONDS)
            op.result = {"characters": len(text)}

        task = asyncio.create_task(ingest())
        store.running.add(task)
        task.add_done_callback(store.running.discard)
        return store.running_answer(op)

    async def get_operation(ctx: Context, operation_id: str | None = None, tool: str | None = None,
                            idempotency_key: str | None = None) -> CallToolResult:
        """What became of an operation: by its id, or by tool and key."""
        op = store.by_id(operation_id) if operation_id else None
        if op is None and tool and idempotency_key:
            op = store.operations.get((store.scope(ctx), tool, idempotency_key))
        if op is None:
            return error("not_found", "no such operation")
        body = {"operation_id": op.operation_id, "status": "processing" if op.result is None else "succeeded",
                "result": op.result}
        return CallToolResult(content=[TextContent(type="text", text=json.dumps(body))], structured_content=body)

    server = MCPServer(name="broken-idempotency", extensions=[Advertised()], middleware=[advertise_in_initialize])
    server.add_tool(create_order, meta={IDENTIFIER: DECLARATION})
    server.add_tool(ingest_document, meta={IDENTIFIER: DECLARATION})
    server.add_tool(get_operation)
    return server


class Advertised(Extension):
    """2026-07-28: the settings under capabilities.extensions of server/discover."""

    identifier = IDENTIFIER

    def settings(self) -> dict[str, Any]:
        return SETTINGS


async def advertise_in_initialize(ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
    """2025-11-25: the settings under capabilities.experimental of the initialize answer."""
    result = await call_next(ctx)
    if ctx.method == "initialize" and isinstance(result, dict):
        result.setdefault("capabilities", {}).setdefault("experimental", {})[IDENTIFIER] = SETTINGS
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m conformance.broken_server", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--defect", action="append", choices=[*DEFECTS, "none"],
                        help="the defects to have (default: all of them)")
    args = parser.parse_args(argv)
    defects = frozenset(args.defect or DEFECTS) - {"none"}
    app = build(defects).streamable_http_app(streamable_http_path="/mcp")
    print(f"broken server on port {args.port} with defects: {', '.join(sorted(defects)) or 'none'}", flush=True)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
