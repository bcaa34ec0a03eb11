"""A ledger entry and its states: what the ledger (ledger.py) stores and the summary (summary.py) renders."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any

# The expiry of an entry whose key is bound to a task still unfinished: never, until it ends.
HELD = float("inf")


class State(enum.StrEnum):
    SUBMITTED = "submitted"  # recorded and sent (or about to be); no answer yet
    IN_PROGRESS = "in_progress"  # the server is still running it
    PENDING_APPROVAL = "pending_approval"  # waits for a person
    UNKNOWN = "unknown"  # may have happened: the server is reconciling it, or the answer never came back
    DONE = "done"  # finished with a result
    FAILED = "failed"  # finished with an error (a retryable one if the budget ran out: see `error`)

    @property
    def finished(self) -> bool:
        return self in (State.DONE, State.FAILED)


@dataclass
class Entry:
    session_id: str
    tool: str
    call_id: str  # the explicit key, or the derived one
    key: str  # the key sent: call_id, or an operation id the server issued (prepare_operation)
    fingerprint: str
    arguments: dict[str, Any]  # business arguments, for the summary
    state: State = State.SUBMITTED
    operation_id: str | None = None
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    attempts: int = 0
    created_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)
    expires_at: float = 0.0

    def expired(self, now: float | None = None) -> bool:
        return self.expires_at <= (time.time() if now is None else now)

    @property
    def held(self) -> bool:
        """Its key answers a task the server says is unfinished: the entry is kept until it ends."""
        return self.expires_at == HELD
