"""The server side of the client contract (idemops_client/README.md), small and in memory.

The platform does not serve `prepare_operation`, `get_operation` or the
tool `_meta` flags yet. Until it does, the client's side of them is tested
against this reference: a real MCP server (the SDK's MCPServer, stateless
Streamable HTTP on uvicorn, real HTTP) that answers exactly as the contract
says, and counts what it executed. When the platform implements the
contract, these tests should run against it instead.

Tools:
- `pay` (high-risk: `_meta` io.idemops/requires-operation-id) accepts only
  an id issued by `prepare_operation` for the same business arguments;
- `pay_unflagged`: the same rule without the `_meta` flag (the client learns
  from the refusal: `invalid_input` with `operation_id_required: true`);
- `note_order`: declares `note` as a non-business field (`_meta`
  io.idemops/non-business-fields), takes any valid key;
- `slow_order`: answers `in_progress` until `finish()` ends it;
- `prepare_operation`, `get_operation`: as in the contract.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp_types import CallToolResult, TextContent, ToolAnnotations

from tests.processes import free_port

META_KEY = "io.idemops/idempotency-key"
ENGINE_FIELDS = {"idempotency_key", "trace_id"}
HIGH_RISK = {"io.idemops/requires-operation-id": True}
NOTE_IS_NOT_BUSINESS = {"io.idemops/non-business-fields": ["note"]}
PREPARED_TTL = timedelta(minutes=10)


def answer(structured: dict[str, Any], error: bool = False) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=json.dumps(structured))],
                          structured_content=structured, is_error=error)


def failure(error_class: str, message: str, **details: Any) -> CallToolResult:
    return answer({"error": {"class": error_class, "message": message, **details}}, error=True)


class ContractServer:
    def __init__(self):
        self.port = free_port()
        self.mcp_url = f"http://127.0.0.1:{self.port}/mcp"
        self.prepared: dict[str, dict[str, Any]] = {}  # operation id -> {tool, fingerprint, expires_at}
        self.records: dict[tuple[str, str], dict[str, Any]] = {}  # (tool, key) -> operation record
        self.executions: list[tuple[str, dict[str, Any]]] = []
        self.prepare_calls = 0
        self.finished = threading.Event()
        self._lock = threading.Lock()
        server = MCPServer(name="contract")
        write = ToolAnnotations(read_only_hint=False, idempotent_hint=True)
        read = ToolAnnotations(read_only_hint=True)

        @server.tool(meta=HIGH_RISK, annotations=write)
        def pay(amount: str, payee: str, ctx: Context, idempotency_key: str | None = None) -> CallToolResult:
            return self.high_risk("pay", {"amount": amount, "payee": payee}, self.key(ctx, idempotency_key))

        @server.tool(annotations=write)
        def pay_unflagged(amount: str, payee: str, ctx: Context, idempotency_key: str | None = None
                          ) -> CallToolResult:
            return self.high_risk("pay_unflagged", {"amount": amount, "payee": payee},
                                  self.key(ctx, idempotency_key))

        @server.tool(meta=NOTE_IS_NOT_BUSINESS, annotations=write)
        def note_order(customer: str, ctx: Context, note: str = "", idempotency_key: str | None = None
                       ) -> CallToolResult:
            return self.run("note_order", {"customer": customer}, self.key(ctx, idempotency_key),
                            lambda: {"order": customer})

        @server.tool(annotations=write)
        def slow_order(customer: str, ctx: Context, idempotency_key: str | None = None) -> CallToolResult:
            return self.run("slow_order", {"customer": customer}, self.key(ctx, idempotency_key),
                            lambda: {"order": customer}, wait=True)

        @server.tool(annotations=write)
        def prepare_operation(tool: str, arguments: dict[str, Any], ctx: Context,
                              idempotency_key: str | None = None) -> CallToolResult:
            if tool not in ("pay", "pay_unflagged"):
                return failure("invalid_input", f"{tool} does not take a server-issued operation id")
            key = self.key(ctx, idempotency_key)
            with self._lock:
                self.prepare_calls += 1
                # The same key and arguments get the same id while it is valid.
                for operation_id, issued in self.prepared.items():
                    if key is not None and issued["key"] == (tool, key) and issued["expires_at"] > datetime.now(UTC):
                        if issued["fingerprint"] != fingerprint(arguments):
                            return failure("conflict", "key used with other arguments",
                                           differing_fields=sorted(arguments))
                        return answer({"operation_id": operation_id, "tool": tool,
                                       "expires_at": issued["expires_at"].isoformat()})
                operation_id = f"op-{uuid.uuid4().hex}"
                expires_at = datetime.now(UTC) + PREPARED_TTL
                self.prepared[operation_id] = {"tool": tool, "fingerprint": fingerprint(arguments),
                                               "expires_at": expires_at, "key": (tool, key)}
            return answer({"operation_id": operation_id, "tool": tool, "expires_at": expires_at.isoformat()})

        @server.tool(annotations=read)
        def get_operation(operation_id: str | None = None, tool: str | None = None,
                          idempotency_key: str | None = None) -> CallToolResult:
            with self._lock:
                if operation_id is not None:
                    record = next((r for r in self.records.values() if r["operation_id"] == operation_id), None)
                else:
                    record = self.records.get((tool or "", idempotency_key or ""))
            if record is None:
                return failure("not_found", "no such operation in your tenant")
            return answer({k: record[k] for k in ("operation_id", "tool", "status", "result", "error")})

        self.app = server.streamable_http_app(stateless_http=True)
        self.uvicorn = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning",
                                                     lifespan="on"))
        self.thread = threading.Thread(target=self.uvicorn.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.uvicorn.started:
            if time.monotonic() > deadline:
                raise RuntimeError("the contract server did not start")
            time.sleep(0.02)

    def stop(self) -> None:
        self.uvicorn.should_exit = True
        self.thread.join(timeout=10)

    @staticmethod
    def key(ctx: Context, argument: str | None) -> str | None:
        return argument or (ctx.request_context.meta or {}).get(META_KEY)

    def high_risk(self, tool: str, business: dict[str, Any], key: str | None) -> CallToolResult:
        with self._lock:
            issued = self.prepared.get(key or "")
            known = (tool, key or "") in self.records
        if not known and (issued is None or issued["tool"] != tool or issued["expires_at"] < datetime.now(UTC)):
            return failure("invalid_input", f"{tool} needs an operation id issued by prepare_operation; "
                                            "this key is not one", operation_id_required=True)
        if not known and issued["fingerprint"] != fingerprint(business):
            return failure("conflict", "the operation id was issued for other arguments",
                           differing_fields=sorted(business))
        return self.run(tool, business, key, lambda: {"payment_id": f"pay-{len(self.executions)}"},
                        operation_id=key)

    def run(self, tool: str, business: dict[str, Any], key: str | None, execute: Any, wait: bool = False,
            operation_id: str | None = None) -> CallToolResult:
        if not key:
            return failure("invalid_input", "idempotency_key is required")
        with self._lock:
            record = self.records.get((tool, key))
            replayed = record is not None
            if record is None:
                record = {"operation_id": operation_id or str(uuid.uuid4()), "tool": tool,
                          "fingerprint": fingerprint(business), "status": "PROCESSING", "result": None,
                          "error": None}
                self.records[(tool, key)] = record
            elif record["fingerprint"] != fingerprint(business):
                return failure("conflict", "key used with other arguments", differing_fields=sorted(business))
            if record["status"] == "PROCESSING" and not (wait and not self.finished.is_set()):
                self.executions.append((tool, business))
                record["result"], record["status"] = execute(), "SUCCEEDED"
                replayed = False
        info = {"status": record["status"], "replayed": replayed, "expires_at": None,
                "operation_id": record["operation_id"]}
        if record["status"] == "PROCESSING":
            return answer({"error": {"class": "in_progress", "message": "still running", "retry_after": 0.2},
                           "idempotency": info}, error=True)
        return answer({**record["result"], "idempotency": info})

    def finish(self) -> None:
        """Let the slow operations end: each runs once, as its executor would."""
        with self._lock:
            self.finished.set()
            for (tool, _), record in self.records.items():
                if record["status"] == "PROCESSING":
                    self.executions.append((tool, {}))
                    record["result"], record["status"] = {"order": "finished"}, "SUCCEEDED"


def fingerprint(arguments: dict[str, Any]) -> str:
    business = {k: v for k, v in arguments.items() if k not in ENGINE_FIELDS | {"note"}}
    return hashlib.sha256(json.dumps(business, sort_keys=True).encode()).hexdigest()
