"""What the engine is given and what it answers: an Operation (who, which tool, which key, which
arguments) and an Outcome, plus the evidence a handler gathers while it executes.
"""

from __future__ import annotations

import enum
import json
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from functools import cached_property
from typing import Any

from django.utils import timezone

from tools_app.core import redaction
from tools_app.core.errors import InvalidInput, ToolFailure
from tools_app.core.keys import FINGERPRINT_AS_SENT, canonical_json, digest, digest_of_canonical
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
    # How long runs the downstream refused before acting may be retried (transitions.mark_failed);
    # None: IDEMOPS_RETRY_WINDOW_SECONDS.
    retry_window: timedelta | None = None
    # Consulted before every run, a first one or a rerun (never before a replay): raises a ToolFailure
    # (`transient` with retry_after) while the call must not run now (an operator paused the tool,
    # its downstream or the tenant; the downstream's circuit breaker is open: tools_app.incidents).
    # Nothing is claimed, run or counted.
    admit: Callable[[], None] | None = None
    # The non-personal argument and result fields operators and auditors search by (the tool's
    # `search_fields`): kept on the record as `attributes` (`searchable`), from the arguments when it is
    # claimed and from the result when it succeeds.
    search_fields: frozenset[str] = frozenset()
    # Held around every run, a first one or a rerun (never a replay, never a follower's wait): a
    # context manager that yields None while this run may go on, or the failure to answer instead
    # (`in_progress`: another operation on the same business entity is running, tools_app.incidents
    # one_at_a_time). Nothing is claimed, run or counted when it yields a failure.
    hold: Callable[[], AbstractContextManager[ToolFailure | None]] | None = None

    # The fingerprint version `arguments` are for (core.keys): a record is claimed under it and keeps it.
    fingerprint_version: int = FINGERPRINT_AS_SENT
    # The business arguments as another fingerprint version covers them, for a record claimed under
    # that version (before a deploy); None: every version covers `arguments`.
    arguments_at: Callable[[int], dict[str, Any]] | None = None

    def covered(self, version: int) -> dict[str, Any]:
        """What the fingerprint of `version` covers of this call."""
        if version == self.fingerprint_version or self.arguments_at is None:
            return self.arguments
        return self._covered.setdefault(version, self.arguments_at(version))

    @cached_property
    def _covered(self) -> dict[int, dict[str, Any]]:
        return {}

    def fingerprint_at(self, version: int) -> str:
        return self.fingerprint if version == self.fingerprint_version else digest(self.covered(version))

    @cached_property
    def canonical_arguments(self) -> str:
        """canonical_json of `arguments`: what the fingerprint digests and the stored form is read from."""
        return canonical_json(self.arguments)

    @cached_property
    def fingerprint(self) -> str:
        return digest_of_canonical(self.canonical_arguments)

    @property
    def stored_arguments(self) -> dict[str, Any]:
        """stored_form(arguments), from the canonical text already written."""
        return stored_form_of(self.canonical_arguments)

    @cached_property
    def field_digests(self) -> dict[str, str]:
        return field_digests(self.arguments)

    def matches(self, bound: Any) -> bool:
        """Whether this call is the operation `bound` (a record, an issued operation id) was fingerprinted
        for, under the version it was fingerprinted with."""
        same: bool = bound.fingerprint == self.fingerprint_at(bound.fingerprint_version)
        return same

    def differing_fields(self, bound: Any) -> list[str]:
        """Where this call differs from the one `bound` holds: a path per difference (`items[2].quantity`,
        `arguments.notes`, `items[3]` for an item only one has), from the stored arguments while they are
        kept; the top-level field otherwise (purged, an issued id, a difference only in a URL's query)."""
        ours = self.covered(bound.fingerprint_version)
        theirs_digests = bound.field_digests
        ours_digests = self.field_digests if ours is self.arguments else field_digests(ours)
        fields = sorted(name for name in theirs_digests.keys() | ours_digests.keys()
                        if theirs_digests.get(name) != ours_digests.get(name))
        stored = getattr(bound, "arguments", None)
        if not stored or getattr(bound, "purged_at", None) is not None:
            return fields
        ours_stored = stored_form(ours)
        paths: list[str] = []
        for name in fields:
            inner = (list(_differences(ours_stored[name], stored[name], name))
                     if name in ours_stored and name in stored else [])
            paths.extend(inner if 0 < len(inner) <= MAX_PATHS_PER_FIELD else [name])
        return paths


# More differences than this inside one top-level argument (a list shifted by one) name the argument.
MAX_PATHS_PER_FIELD = 20


def field_digests(arguments: dict[str, Any]) -> dict[str, str]:
    """A digest per top-level argument, kept with the fingerprint to name what differs."""
    return {name: digest(value) for name, value in arguments.items()}


# The longest attribute value kept: a reference, not a text.
ATTRIBUTE_MAX = 200


def searchable(values: dict[str, Any] | None, fields: frozenset[str]) -> dict[str, str]:
    """The record's `attributes` from `values` (arguments or a result): each of `fields` present with a
    plain value (text, number, true/false), as text, so that `?attribute=order_id=42` finds 42. Lists,
    objects, nulls and values longer than ATTRIBUTE_MAX are left out: attributes are references."""
    found: dict[str, str] = {}
    for name in sorted(fields & (values or {}).keys()):
        value = (values or {})[name]
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, str | int | float | Decimal):
            text = str(value)
        else:
            continue
        if len(text) <= ATTRIBUTE_MAX:
            found[name] = text
    return found


def stored_form(arguments: dict[str, Any]) -> dict[str, Any]:
    """The business arguments as a record keeps them to be read: canonical JSON, URLs without their
    query (tokens); the fingerprint covers them in full."""
    return stored_form_of(canonical_json(arguments))


def stored_form_of(canonical: str) -> dict[str, Any]:
    """stored_form() of the arguments whose canonical_json is `canonical`."""
    stored: dict[str, Any] = redaction.scrub_urls(json.loads(canonical))
    return stored


def _differences(ours: Any, theirs: Any, path: str) -> Iterator[str]:
    if isinstance(ours, dict) and isinstance(theirs, dict):
        for name in sorted(ours.keys() | theirs.keys()):
            inner = f"{path}.{name}"
            if name in ours and name in theirs:
                yield from _differences(ours[name], theirs[name], inner)
            else:
                yield inner
    elif isinstance(ours, list) and isinstance(theirs, list):
        for index in range(max(len(ours), len(theirs))):
            if index < len(ours) and index < len(theirs):
                yield from _differences(ours[index], theirs[index], f"{path}[{index}]")
            else:
                yield f"{path}[{index}]"
    elif canonical_json(ours) != canonical_json(theirs):  # canonical: True is not 1, 1.0 is
        yield path


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
    # known, the operation id that record has (engine.claims.uncommitted).
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
