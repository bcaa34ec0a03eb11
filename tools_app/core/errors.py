"""Errors an agent can act on.

Every failure a tool call can end in is a ToolFailure with an ErrorClass. The
MCP layer renders it as an `isError` result whose structured content is
`{"error": {"class", "message", "retry_after"?, "differing_fields"?}}`.
Only `transient` and `rate_limited` are retryable with the same key (after `retry_after`).

An exception that is no ToolFailure is either an infrastructure failure (INFRASTRUCTURE_ERRORS:
`transient`) or a programming error (`internal_error`): never retried, since the same code
fails the same way, and never described beyond its type (its text may hold personal data).
"""

from __future__ import annotations

from typing import Any

import psycopg
from django.db import InterfaceError, OperationalError, models
from django.db import InternalError as DatabaseInternalError

# The one rule for `unknown_outcome`: in every such message, the MCP server's instructions and the README.
UNKNOWN_OUTCOME_ADVICE = ("do not retry with a new key; calling again with the same key is safe and answers the "
                          "reconciled outcome once it is known")
# The one rule for `permission_denied`: the MCP server's instructions and the README say it.
PERMISSION_DENIED_ADVICE = ("retrying as is gets the same answer: re-authorize (a token or role that allows it) "
                            "or ask a person to allow it or to do it; a rejected approval is a person's decision")


class ErrorClass(models.TextChoices):
    """What an agent can do about an error. Shared by every tool."""

    INVALID_INPUT = "invalid_input", "Invalid input: fix the arguments"
    PERMISSION_DENIED = "permission_denied", "Permission denied"
    NOT_FOUND = "not_found", "Not found"
    CONFLICT = "conflict", "Key reused with other parameters: a new operation needs a new key"
    DOWNSTREAM_CONFLICT = "downstream_conflict", (
        "The downstream system holds this key for another request: an operator must check")
    IN_PROGRESS = "in_progress", "Still running: ask again after retry_after"
    TRANSIENT = "transient", "Transient: retry with the same key after retry_after"
    RATE_LIMITED = "rate_limited", "Over a limit of the tenant or agent: retry with the same key after retry_after"
    UNKNOWN_OUTCOME = "unknown_outcome", (
        "Outcome unknown, being reconciled: no new key; the same key answers the outcome once known")
    EXPIRED = "expired", "Key past retention: a person must check"
    ALREADY_DONE = "already_done", "Already done"
    INTERNAL_ERROR = "internal_error", "A fault of the server: do not retry; report the reference to an operator"
    PENDING_APPROVAL = "pending_approval", "Waiting for a person's approval: ask again with the same key"
    NOT_EXECUTED = "not_executed", (
        "Nothing was done, and this key is closed: the downstream refused every run within the retry window. "
        "Start a new operation (a new key) if it is still wanted")
    CONFIRMATION_REQUIRED = "confirmation_required", (
        "The person behind the agent must confirm this call first: their host asks them (elicitation), or "
        "they open details.confirmation.url; then call again with the same key. Nothing was done")
    CONFIRMATION_DECLINED = "confirmation_declined", (
        "The person behind the agent declined this call: nothing was done, and this key is closed")
    CONFIRMATION_REFUSED = "confirmation_refused", (
        "This confirmation does not hold for this call (other arguments, another principal, past its deadline, "
        "or used already): nothing was done")


class ToolFailure(Exception):
    error_class: ErrorClass = ErrorClass.INVALID_INPUT

    def __init__(
        self,
        message: str,
        *,
        retry_after: float | None = None,
        differing_fields: list[str] | None = None,
        details: dict[str, Any] | None = None,
        evidence: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after
        self.differing_fields = differing_fields
        self.details = details or {}
        # What was asked downstream and what came back; kept on the record,
        # never sent to the agent.
        self.evidence = evidence
        self._built = True

    def __setattr__(self, name: str, value: Any) -> None:
        # Immutable once built, so the error an agent hears is the one that was recorded; Python
        # itself still sets the dunder attributes (__traceback__, __cause__, __notes__).
        if getattr(self, "_built", False) and not name.startswith("__"):
            raise AttributeError(f"a failure is immutable once built: {type(self).__name__}.replaced(...)")
        super().__setattr__(name, value)

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickling rebuilds through __init__ (the default sets the attributes after it, which is refused).
        return _rebuilt, (type(self), self.message, self.retry_after, self.differing_fields, self.details,
                          self.evidence)

    def replaced(self, *, message: str | None = None, retry_after: float | None = None,
                 details: dict[str, Any] | None = None) -> ToolFailure:
        """A new failure of the same class with these fields changed."""
        return type(self)(
            self.message if message is None else message,
            retry_after=self.retry_after if retry_after is None else retry_after,
            differing_fields=self.differing_fields,
            details=self.details if details is None else details,
            evidence=self.evidence,
        )

    @property
    def retryable(self) -> bool:
        return self.error_class in RETRYABLE

    def as_dict(self) -> dict[str, Any]:
        error: dict[str, Any] = {"class": str(self.error_class), "message": self.message}
        if self.retry_after is not None:
            error["retry_after"] = round(self.retry_after, 3)
        if self.differing_fields is not None:
            error["differing_fields"] = self.differing_fields
        error.update(self.details)
        return error

    @classmethod
    def from_dict(cls, error: dict[str, Any]) -> ToolFailure:
        """Rebuild a stored failure, so a replay raises the same error."""
        failure_type = FAILURE_TYPES.get(error["class"], ToolFailure)
        known = {"class", "message", "retry_after", "differing_fields"}
        return failure_type(
            error["message"],
            retry_after=error.get("retry_after"),
            differing_fields=error.get("differing_fields"),
            details={k: v for k, v in error.items() if k not in known},
        )


def _rebuilt(cls: type[ToolFailure], message: str, retry_after: float | None, differing_fields: list[str] | None,
             details: dict[str, Any], evidence: dict[str, Any] | None) -> ToolFailure:
    return cls(message, retry_after=retry_after, differing_fields=differing_fields, details=details, evidence=evidence)


class Refused(Exception):
    """An operator's action not taken: `reason` is what the console shows (and the audit event says).

    `subject` is the object it was refused on, for a caller that audits the refusal later.
    """

    def __init__(self, reason: str, subject: models.Model | None = None) -> None:
        super().__init__(reason)
        self.reason, self.subject = reason, subject


class InvalidInput(ToolFailure):
    error_class = ErrorClass.INVALID_INPUT


class PermissionDenied(ToolFailure):
    error_class = ErrorClass.PERMISSION_DENIED


class NotFound(ToolFailure):
    error_class = ErrorClass.NOT_FOUND


class Conflict(ToolFailure):
    error_class = ErrorClass.CONFLICT


class DownstreamConflict(ToolFailure):
    """The downstream system already holds the key we forwarded for a *different* request (its 409).

    Not `conflict`: our own record saw no other arguments, so there are no
    differing_fields, and a new key is no fix either (the earlier request may
    be the same operation, done once already). A person must look.
    """

    error_class = ErrorClass.DOWNSTREAM_CONFLICT


class InProgress(ToolFailure):
    error_class = ErrorClass.IN_PROGRESS


class Transient(ToolFailure):
    error_class = ErrorClass.TRANSIENT


class Held(Transient):
    """Not run now, by the platform's choice: an operator paused the tool, its downstream or the
    tenant's writes, the downstream's circuit breaker is open, or its calls in flight are at their
    limit (tools_app.incidents). Nothing was done; no run or task attempt is counted against it."""


class RateLimited(ToolFailure):
    """Over a per-tenant or per-agent limit (calls per minute, concurrent tasks): nothing was done,
    nothing was queued; the same call may come again after `retry_after`."""

    error_class = ErrorClass.RATE_LIMITED


class UnknownOutcome(ToolFailure):
    """Raised by a handler when a downstream request may or may not have taken
    effect (a timeout after sending, a broken connection): the record becomes
    UNKNOWN and is reconciled instead of retried."""

    error_class = ErrorClass.UNKNOWN_OUTCOME


class NotExecuted(ToolFailure):
    """Final: every run of the key was refused by the downstream system before it acted (a known
    non-execution: 503 or 429 "nothing done", connection refused, a Transient raised before
    sending) for the tool's whole retry window. Nothing was done; a new operation needs a new key."""

    error_class = ErrorClass.NOT_EXECUTED


class Expired(ToolFailure):
    error_class = ErrorClass.EXPIRED


class AlreadyDone(ToolFailure):
    error_class = ErrorClass.ALREADY_DONE


class PendingApproval(ToolFailure):
    """Not a failure of the operation: it waits for a person. Carries `approval` details."""

    error_class = ErrorClass.PENDING_APPROVAL


class ConfirmationRequired(ToolFailure):
    """The person behind the agent has not confirmed this call yet; nothing was claimed or run."""

    error_class = ErrorClass.CONFIRMATION_REQUIRED


class ConfirmationDeclined(ToolFailure):
    """The person declined: the key's record is FAILED with this class, and its replay says so."""

    error_class = ErrorClass.CONFIRMATION_DECLINED


class ConfirmationRefused(ToolFailure):
    """A confirmation presented for this call does not hold for it: nothing ran."""

    error_class = ErrorClass.CONFIRMATION_REFUSED


class InternalError(ToolFailure):
    """A programming error of the server, not of the call: a retry runs the same code and fails the
    same way (seed 003 §7: never retry every failure). Final for the key; an operator finds the
    record or task by the reference the message names."""

    error_class = ErrorClass.INTERNAL_ERROR


# The one rule for `internal_error`: in every such message, the MCP server's instructions and the README.
INTERNAL_ERROR_ADVICE = "do not retry; report the reference to an operator"

# What fails for reasons outside the code and may pass on another run: the database unavailable
# or failing inside (PEP 249's OperationalError, InterfaceError, InternalError: psycopg's own, and
# Django's wrappers of them), a connection reset, a timeout. A serialization failure or a deadlock
# is an OperationalError too. A downstream 5xx or 429 is a Transient or RateLimited its client raises.
INFRASTRUCTURE_ERRORS: tuple[type[BaseException], ...] = (
    OperationalError, InterfaceError, DatabaseInternalError, psycopg.OperationalError, psycopg.InterfaceError,
    psycopg.InternalError, ConnectionError, TimeoutError)


def internal_error(exc: BaseException, reference: object, *, what: str = "nothing was committed") -> InternalError:
    """`exc`, a programming error, as the agent hears it: its type (never its text) and the reference
    (an operation or task id) an operator looks up in the console."""
    return InternalError(f"internal error ({type(exc).__name__}); {what}. {INTERNAL_ERROR_ADVICE}: {reference}",
                         details={"reference": str(reference)})


def invalid_data(exc: Exception) -> InvalidInput:
    """A database data error (django.db.DataError: out of range, too long, unstorable) as the
    caller's error. Never transient: the same values fail the same way. Names the kind, not the value."""
    kind = type(exc.__cause__ or exc).__name__
    return InvalidInput(f"a value does not fit what the database stores ({kind}); nothing was committed. "
                        "Check the ranges and lengths the tool's schema states")


FAILURE_TYPES: dict[str, type[ToolFailure]] = {
    str(t.error_class): t
    for t in (InvalidInput, PermissionDenied, NotFound, Conflict, DownstreamConflict, InProgress, Transient,
              RateLimited, UnknownOutcome, Expired, AlreadyDone, PendingApproval, InternalError, NotExecuted,
              ConfirmationRequired, ConfirmationDeclined, ConfirmationRefused)
}

# The classes a retry with the same key may run again (after retry_after).
RETRYABLE = frozenset({ErrorClass.TRANSIENT, ErrorClass.RATE_LIMITED})
