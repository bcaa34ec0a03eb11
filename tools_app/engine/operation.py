"""What the engine is given and what it answers: an Operation (who, which tool, which key, which
arguments) and an Outcome, plus the evidence a handler gathers while it executes.
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import timedelta
from functools import cached_property
from typing import Any

from django.utils import timezone

from tools_app.core.errors import InvalidInput, ToolFailure
from tools_app.core.keys import digest
from tools_app.engine.models import IdempotencyRecord

DEFAULT_RETENTION = timedelta(hours=24)


class ExpiryPolicy(enum.StrEnum):
    """What a call with a key past its retention does."""

    REEXECUTE = "reexecute"  # the key is free again: run as a new operation
    HOLD = "hold"  # answer `expired`; a person decides


class LeaseLost(Exception):
    """The record is no longer ours (the sweep declared it UNKNOWN)."""


class ClaimWaitExpired(Exception):
    """A claim waited the whole follower wait for another call's uncommitted claim of the key."""


@dataclass(frozen=True)
class Operation:
    """A write call as the engine sees it: who, which tool, which key, what arguments."""

    tenant_id: int
    tool: str
    key: str
    arguments: dict[str, Any]  # business arguments only: what the fingerprint covers
    actor: str = ""
    trace_id: str = ""  # the call's W3C trace id and span (tools_app.core.tracing), kept on the record
    span_id: str = ""
    retention: timedelta = DEFAULT_RETENTION
    on_expiry: ExpiryPolicy = ExpiryPolicy.REEXECUTE
    # True: the side effect is local and commits with the record (a crash
    # leaves nothing). False: it happens elsewhere (a downstream call), so
    # the engine holds no transaction across it and an interrupted call ends
    # UNKNOWN, to be reconciled.
    transactional: bool = True
    # Consulted before every execution of a sensitive tool (tools_app.approvals.gate):
    # an Outcome diverts the call to a person's approval, None lets it run.
    approval: Callable[[IdempotencyRecord], Outcome | None] | None = None
    # Set when the key is an operation id issued in advance (engine.prepared): the record claimed
    # for it takes this id as its operation_id. An id names one operation only, never a later one.
    operation_id: uuid.UUID | None = None

    @cached_property
    def fingerprint(self) -> str:
        return digest(self.arguments)

    @cached_property
    def field_digests(self) -> dict[str, str]:
        return {name: digest(value) for name, value in self.arguments.items()}

    def differing_fields(self, record: IdempotencyRecord) -> list[str]:
        stored = record.field_digests
        return sorted(name for name in stored.keys() | self.field_digests.keys()
                      if stored.get(name) != self.field_digests.get(name))


# In the error object of a refused key: the tool takes only an operation id issued in advance, and
# nothing ran under this key (a client may get an id from prepare_operation and call again).
OPERATION_ID_REQUIRED = "operation_id_required"


def operation_id_spent(operation_id: uuid.UUID) -> InvalidInput:
    """A call with an issued id whose operation's key was freed (its retention ended, or an operator
    released it): the id named that operation, so a new one needs a new id."""
    return InvalidInput(f"operation id {operation_id} named an earlier operation whose retention has ended; a new "
                        "operation needs a new operation id from prepare_operation",
                        details={OPERATION_ID_REQUIRED: True})


@dataclass
class Outcome:
    """What a call ended in: a result (first or replayed) or an error."""

    # Not saved (no pk) when the key's record is not committed yet (in_progress): it holds what is
    # known, the operation id that record has (engine.transitions.uncommitted).
    record: IdempotencyRecord
    replayed: bool = False
    error: ToolFailure | None = None
    executed: bool = False  # this call ran the side effect (or tried to)

    @property
    def result(self) -> dict[str, Any] | None:
        return None if self.error else self.record.result


# The side effect: receives the claimed record, returns the JSON result. For
# local effects it runs inside the transaction that marks the record done.
Executor = Callable[[IdempotencyRecord], dict[str, Any]]


def evidence_entry(source: str, **facts: Any) -> dict[str, Any]:
    """One piece of evidence: who looked (executor, reconciler, operator, sweep), when, and what they saw."""
    return {"at": timezone.now().isoformat(), "source": source, **facts}


# Evidence a handler gathers while it executes (e.g. each downstream answer),
# stored with the record when it succeeds. Failures carry their own evidence.
_gathered: ContextVar[list[dict[str, Any]] | None] = ContextVar("gathered_evidence", default=None)


def note_evidence(entry: dict[str, Any]) -> None:
    """Keep `entry` for the record being executed in this context (no-op outside one)."""
    gathered = _gathered.get()
    if gathered is not None:
        gathered.append(entry)


@contextmanager
def gathering_evidence() -> Iterator[list[dict[str, Any]]]:
    """Collect what `note_evidence` is given in this context (the executor stores it with the record)."""
    entries: list[dict[str, Any]] = []
    token = _gathered.set(entries)
    try:
        yield entries
    finally:
        _gathered.reset(token)
