"""What the packages built on the toolkit tell it (core.hooks), so that a call reaches them
without the toolkit importing them.

- `approval_gate(spec, tenant_id, actor, args)`: for a sensitive tool, the
  check the engine runs before executing (Operation.approval); approvals
  registers it. Without it a sensitive call is refused, never run unchecked.
- `run_long_tool(spec, caller, arguments, meta_key) -> CallResult`: a call of a
  long tool starts or rejoins its task; tasks registers it.
- `confirm(spec, tenant_id, actor, args, operation, execute, confirming)`: for a tool with a
  confirmation rule called through an MCP host, the operation to run once its person confirmed (or
  declined); approvals registers it. Without it such a call is refused, never run unasked.
- `after_unknown()`: a call just ended UNKNOWN; reconciliation registers
  "reconcile it soon". By default the periodic reconciliation finds it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

from pydantic import BaseModel

from tools_app.core.errors import PermissionDenied
from tools_app.core.hooks import Hooks
from tools_app.toolkit.registry import ToolSpec


def _no_approvals(spec: ToolSpec, tenant_id: int, actor: str, args: BaseModel) -> NoReturn:
    raise PermissionDenied(f"{spec.name} needs a person's approval and approvals are not installed")


# `caller` is a toolkit.calls.Caller (calls imports this module, so its types cannot be named here).
def _no_tasks(spec: ToolSpec, caller: Any, arguments: dict[str, Any], meta_key: str | None) -> NoReturn:
    raise LookupError(f"{spec.name} runs as a task, but no tasks package registered its hook")


def _no_confirmations(spec: ToolSpec, *args: Any) -> NoReturn:
    raise PermissionDenied(f"{spec.name} needs its user's confirmation and confirmations are not installed")


def _left_to_the_schedule() -> None:
    """The periodic reconciliation finds UNKNOWN records by itself."""


@dataclass
class ToolkitHooks(Hooks):
    approval_gate: Callable[..., Callable[[Any], Any]] = _no_approvals
    run_long_tool: Callable[..., Any] = _no_tasks
    after_unknown: Callable[[], None] = _left_to_the_schedule
    confirm: Callable[..., Any] = _no_confirmations


hooks = ToolkitHooks()
