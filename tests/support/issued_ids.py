"""High-risk tools take only an operation id issued by prepare_operation as their key.

Tests of other behaviour (approvals, payments, crashes) name such an operation by a label, as
they name any other; these helpers turn the label into an issued id the way an agent does: the
first use of a label prepares an id for the call's arguments, and every later use of the label
(per tenant and tool) carries that same id verbatim, whatever the arguments. So a retry is a
replay, and a retry with other arguments is the tool's `conflict`, as for any key. Tools that
take any key get the label itself.

The behaviour of issued ids itself is tested with explicit calls in tests/engine/test_operation_ids.py
and tests/engine/test_get_operation.py.
"""

from __future__ import annotations

from typing import Any

from tests.support.mcp_client import call_sync
from tools_app.models import PreparedOperation
from tools_app.toolkit.calls import Caller, CallResult, call_tool
from tools_app.toolkit.registry import get_tool

_ISSUED: dict[tuple[Any, str, str], str] = {}


def _cached(owner: Any, tenant_filter: dict[str, Any], tool: str, label: str) -> str | None:
    issued = _ISSUED.get((owner, tool, label))
    if issued is not None and PreparedOperation.objects.filter(pk=issued, tool=tool, **tenant_filter).exists():
        return issued
    return None  # never issued, or issued in an earlier test's database


def business(arguments: dict[str, Any]) -> dict[str, Any]:
    return {name: value for name, value in arguments.items() if name != "idempotency_key"}


def issued_key(caller: Caller, tool: str, label: str, arguments: dict[str, Any]) -> str:
    """The key a call of `tool` labelled `label` carries, in process."""
    if not get_tool(tool).requires_operation_id:
        return label
    if (issued := _cached(caller.tenant_id, {"tenant_id": caller.tenant_id}, tool, label)) is not None:
        return issued
    prepared = call_tool(get_tool("prepare_operation"), caller,
                         {"tool": tool, "arguments": business(arguments), "idempotency_key": f"prepare-{label}"})
    assert prepared.error is None, prepared.error
    _ISSUED[(caller.tenant_id, tool, label)] = prepared.result["operation_id"]
    return prepared.result["operation_id"]


def call_labelled(caller: Caller, tool: str, arguments: dict[str, Any]) -> CallResult:
    """call_tool, with `idempotency_key` read as the operation's label."""
    key = issued_key(caller, tool, arguments["idempotency_key"], arguments)
    return call_tool(get_tool(tool), caller, {**arguments, "idempotency_key": key})


def issued_key_over_mcp(url: str, token: str, tool: str, label: str, arguments: dict[str, Any]) -> str:
    """The key a call of `tool` labelled `label` carries, for an agent calling over MCP with `token`."""
    if not get_tool(tool).requires_operation_id:
        return label
    if (issued := _cached(token, {}, tool, label)) is not None:
        return issued
    prepared = call_sync(url, token, "prepare_operation",
                         {"tool": tool, "arguments": business(arguments), "idempotency_key": f"prepare-{label}"})
    assert not prepared.is_error, prepared.structured_content
    _ISSUED[(token, tool, label)] = prepared.structured_content["operation_id"]
    return prepared.structured_content["operation_id"]


def labelled_arguments(url: str, token: str, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """`arguments` with its `idempotency_key` label replaced by the key the call carries."""
    return {**arguments, "idempotency_key": issued_key_over_mcp(url, token, tool, arguments["idempotency_key"],
                                                                arguments)}


def call_labelled_sync(url: str, token: str, tool: str, arguments: dict[str, Any], **kwargs: Any):
    """tests.support.mcp_client.call_sync, with `idempotency_key` read as the operation's label."""
    return call_sync(url, token, tool, labelled_arguments(url, token, tool, arguments), **kwargs)
