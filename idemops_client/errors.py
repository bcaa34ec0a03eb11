"""What a call can end in besides a result, and which answers are worth asking again."""

from __future__ import annotations

from typing import Any

# Answers that may change if the same call (same key) is made again later.
RETRYABLE = frozenset({
    "transient",         # nothing was done; the server says when to come back
    "in_progress",       # the first call with this key is still running
    "unknown_outcome",   # it may have happened; the server is reconciling it
    "pending_approval",  # a person must approve it first
    "rate_limited",      # too many calls; come back after retry_after
    "transport",         # client side: connection refused, reset, dropped answer, timeout
    "unavailable",       # client side: HTTP 5xx (a 503 with Retry-After while the database is down)
})
# Answers that are the same however often the call is repeated.
DETERMINISTIC = frozenset({
    "invalid_input", "permission_denied", "not_found", "conflict", "expired", "already_done",
    "downstream_conflict",
    "not_executed",    # nothing was done and the key is closed: a new operation needs a new key
    "internal_error",  # a fault of the server (a bug): report error.reference to an operator
    # The person behind the agent: must confirm first (show them error.confirmation.url), declined (final),
    # or the confirmation answer did not hold for the call. A retry as is decides nothing.
    "confirmation_required", "confirmation_declined", "confirmation_refused",
    "unauthorized",    # client side: HTTP 401/403, the token is wrong
    "protocol_error",  # client side: a JSON-RPC error (unknown method, malformed request)
})


def is_retryable(error_class: str, retry_after: float | None) -> bool:
    """Known classes by the tables above; a class this client does not know is retried only
    if the server said when (a retry_after), and never otherwise."""
    if error_class in RETRYABLE:
        return True
    if error_class in DETERMINISTIC:
        return False
    return retry_after is not None


class ClientError(Exception):
    """Base of everything this package raises about a call."""


class ToolCallError(ClientError):
    """The call ended in an error class: the server's (`error.class`) or the client's (transport,
    unavailable, unauthorized, protocol_error). `error` is the server's whole error object."""

    def __init__(self, tool: str, error_class: str, message: str, *, key: str | None = None,
                 retry_after: float | None = None, error: dict[str, Any] | None = None, attempts: int = 0):
        self.tool = tool
        self.error_class = error_class
        self.message = message
        self.key = key
        self.retry_after = retry_after
        self.error = error or {"class": error_class, "message": message}
        self.attempts = attempts
        self.trace_id: str | None = None  # the operation's W3C trace id (set by the client)
        super().__init__(self._text())

    @property
    def retryable(self) -> bool:
        return is_retryable(self.error_class, self.retry_after)

    def _text(self) -> str:
        return f"{self.tool}: {self.error_class}: {self.message}"


class RetriesExhausted(ToolCallError):
    """The retry budget ran out (`reason` is "attempts" or "time"); `error_class` is the last answer's class.
    The operation keeps its key: calling again later asks about the same operation."""

    def __init__(self, tool: str, error_class: str, message: str, *, reason: str, elapsed: float, **kwargs: Any):
        self.reason = reason
        self.elapsed = elapsed
        super().__init__(tool, error_class, message, **kwargs)

    def _text(self) -> str:
        budget = "attempts" if self.reason == "attempts" else "time"
        return (f"{self.tool}: retry budget exhausted ({budget}: {self.attempts} attempts in {self.elapsed:.1f}s); "
                f"last answer {self.error_class}: {self.message}")
