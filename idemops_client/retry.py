"""The retry budget and the backoff between attempts."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class RetryPolicy:
    """How hard one call tries: at most `max_attempts` attempts and `max_seconds` in all.

    Between attempts it waits a full-jitter exponential backoff, uniform in
    [0, min(max_delay, base_delay * 2**(attempt-1))], or the server's
    `retry_after` (HTTP Retry-After for a 503) if that is longer, spread by up
    to 10% so that clients told the same time do not return together. When
    the next wait would end past `max_seconds`, it stops at once instead of
    sleeping in vain.
    """

    max_attempts: int = 6
    max_seconds: float = 60.0
    base_delay: float = 0.25
    max_delay: float = 10.0
    attempt_timeout: float = 30.0  # one request's wait for its answer

    def __post_init__(self) -> None:
        if self.max_attempts < 1 or self.max_seconds <= 0 or self.attempt_timeout <= 0:
            raise ValueError("max_attempts must be at least 1; max_seconds and attempt_timeout positive")

    def delay(self, attempt: int, retry_after: float | None, rng: random.Random | None = None) -> float:
        """The wait after failed attempt number `attempt` (1-based)."""
        uniform = rng.uniform if rng is not None else random.uniform
        backoff = uniform(0, min(self.max_delay, self.base_delay * 2 ** (attempt - 1)))
        if retry_after is None:
            return backoff
        return max(backoff, retry_after * uniform(1.0, 1.1))
