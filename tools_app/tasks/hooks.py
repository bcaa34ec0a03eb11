"""What a sibling package does for tasks (core.hooks), so that tasks never imports it.

- `enqueue_event(*, tenant_id, kind, payload, record)`: write an outbox event in
  the current transaction (outbox registers `outbox.enqueue`). A finished task
  whose caller gave a `notify_url` writes its webhook this way, in the
  transaction of its last transition. Without it such a task cannot finish:
  a webhook promised and silently dropped is worse than an error.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tools_app.core.hooks import Hooks


def _no_outbox(*, tenant_id: int, kind: str, payload: dict[str, Any], record: Any = None) -> Any:
    raise LookupError(f"a task needs the outbox for its {kind} event, but no outbox package registered its hook")


@dataclass
class TasksHooks(Hooks):
    enqueue_event: Callable[..., Any] = _no_outbox


hooks = TasksHooks()
