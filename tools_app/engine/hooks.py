"""What the packages built on the engine tell it (core.hooks), so that it never imports them.

- `follow_awaiting_approval(record) -> Outcome`: the answer to a caller whose
  record waits for a person (approvals registers it).
- `settle_expired(record)`: settles at once what can be settled about a record
  a follower just took from a dead executor (reconciliation registers it); by
  default the record waits for the reconciliation sweep.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tools_app.core.hooks import Hooks
from tools_app.engine.models import IdempotencyRecord
from tools_app.engine.operation import Outcome


def _left_to_the_sweep(record: IdempotencyRecord) -> None:
    """Until a settler is registered, an expired record waits for the reconciliation sweep."""


def _nobody_approves(record: IdempotencyRecord) -> Outcome:
    raise LookupError(f"record {record.pk} awaits approval, but no approvals package registered its hook")


@dataclass
class EngineHooks(Hooks):
    follow_awaiting_approval: Callable[[IdempotencyRecord], Outcome] = _nobody_approves
    settle_expired: Callable[[IdempotencyRecord], None] = _left_to_the_sweep


hooks = EngineHooks()
