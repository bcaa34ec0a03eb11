"""What the server says of the idempotency extension `io.idemops/idempotency` (docs/extension/idempotency.md).

A server that implements the extension advertises it (section 2: `capabilities.extensions` from
`server/discover` at 2026-07-28, `capabilities.experimental` from `initialize` at 2025-11-25) and
declares, in each tool's `_meta` under the same identifier, whether the tool takes a key, whether the
key must be an operation id the server issued, and which arguments are not business data (section 3).
The client reads that instead of guessing from input schemas; only a server that does not advertise
the extension is guessed about (client.tool_info).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mcp import Client
from mcp.types import ListToolsResult

from idemops_client.transport import list_tools

IDENTIFIER = "io.idemops/idempotency"


@dataclass(frozen=True)
class Advertisement:
    """The extension's settings as advertised (section 2)."""

    version: str
    key_meta: str
    replayed_meta: str
    get_operation_tool: str
    prepare_operation_tool: str

    @classmethod
    def of(cls, capabilities: Any) -> Advertisement | None:
        if capabilities is None:
            return None
        for place in (getattr(capabilities, "extensions", None), getattr(capabilities, "experimental", None)):
            settings = (place or {}).get(IDENTIFIER)
            if isinstance(settings, dict) and settings.get("version"):
                return cls(version=str(settings["version"]),
                           key_meta=settings.get("keyMeta", "io.idemops/idempotency-key"),
                           replayed_meta=settings.get("replayedMeta", "io.idemops/replayed"),
                           get_operation_tool=settings.get("getOperationTool", "get_operation"),
                           prepare_operation_tool=settings.get("prepareOperationTool", "prepare_operation"))
        return None


@dataclass(frozen=True)
class Declaration:
    """A tool's `_meta[IDENTIFIER]` (section 3); a tool without one takes no key."""

    key_required: bool
    requires_operation_id: bool
    non_business_fields: frozenset[str]


def declaration(tool: Any) -> Declaration | None:
    declared = (tool.meta or {}).get(IDENTIFIER)
    if not isinstance(declared, dict):
        return None
    return Declaration(key_required=declared.get("key") == "required",
                       requires_operation_id=bool(declared.get("requiresOperationId")),
                       non_business_fields=frozenset(declared.get("nonBusinessFields") or ()))


async def advertised_tools(client: Client) -> tuple[Advertisement | None, ListToolsResult]:
    """tools/list, with the advertisement of the connection it was listed on."""
    return Advertisement.of(client.server_capabilities), await list_tools(client)
