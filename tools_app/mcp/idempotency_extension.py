"""The idempotency extension `io.idemops/idempotency` (docs/extension/idempotency.md), as advertised.

The server declares it with the settings of its section 2: at 2026-07-28 under
`capabilities.extensions` (`server/discover`, from the SDK's Extension hook); at 2025-11-25, whose
capabilities have no `extensions`, under `capabilities.experimental` of the `initialize` answer
(`advertise_in_initialize`, a middleware: the SDK's wire model of that revision drops `extensions`); and
each tool that takes a key says so in its own `_meta` under the same identifier (section 3), so
a client reads what to do instead of guessing from input schemas. The behaviour itself is the
engine's (tools_app.engine through tools_app.toolkit.calls); this module only describes it.
"""

from __future__ import annotations

from typing import Any

from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import Extension

from tools_app.core import keys
from tools_app.engine.operation import ExpiryPolicy
from tools_app.mcp.runtime import EXPIRES_META, REPLAYED_META
from tools_app.toolkit.registry import ToolSpec

IDENTIFIER = "io.idemops/idempotency"
VERSION = "2026-12-01"
KEY_ARGUMENT = "idempotency_key"
GET_OPERATION_TOOL = "get_operation"
PREPARE_OPERATION_TOOL = "prepare_operation"
# The revisions negotiated by `initialize` (2026-07-28 has none: server/discover advertises it).
LEGACY_VERSIONS = frozenset({"2025-03-26", "2025-06-18", "2025-11-25"})
AFTER_RETENTION = {ExpiryPolicy.REEXECUTE: "new_operation", ExpiryPolicy.HOLD: "expired"}


class IdempotencyExtension(Extension):
    identifier = IDENTIFIER

    def settings(self) -> dict[str, Any]:
        return {
            "version": VERSION,
            "keyMeta": keys.META_KEY,
            "keyArgument": KEY_ARGUMENT,
            "keyPattern": keys.KEY_PATTERN.pattern,
            "replayedMeta": REPLAYED_META,
            "expiresMeta": EXPIRES_META,
            "getOperationTool": GET_OPERATION_TOOL,
            "prepareOperationTool": PREPARE_OPERATION_TOOL,
        }


async def advertise_in_initialize(ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
    result = await call_next(ctx)
    if ctx.method == "initialize" and isinstance(result, dict) and result.get("protocolVersion") in LEGACY_VERSIONS:
        capabilities = result.setdefault("capabilities", {})
        (capabilities.get("experimental") or capabilities.setdefault("experimental", {}))[IDENTIFIER] = (
            IdempotencyExtension().settings())
    return result


def tool_declaration(spec: ToolSpec) -> dict[str, Any] | None:
    """The tool's `_meta[IDENTIFIER]` (section 3): only a tool that takes a key has one."""
    if not spec.writes:
        return None
    return {
        "key": "required",
        "requiresOperationId": spec.requires_operation_id,
        "nonBusinessFields": sorted(spec.non_business_fields),
        "retentionSeconds": int(spec.retention_now().total_seconds()),
        "afterRetention": AFTER_RETENTION[spec.on_expiry],
    }
