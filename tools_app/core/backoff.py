"""How long to wait before the next attempt: exponential backoff with equal jitter, the one formula
of every retry idemops schedules (a write's `retry_after`, reconciliation, the outbox, long tasks).

Attempt n (the n-th attempt just failed, n ≥ 1) waits uniformly in [cap/2, cap],
cap = min(ceiling, base·2ⁿ⁻¹).

Why equal jitter and not full jitter (uniform in [0, cap]): both spread work that failed together
(an outage ends and a thousand outbox events, records or tasks come due at once) over a window
that grows with each attempt. Full jitter does a little less work in total, but any single wait
may be close to nothing: a retry can hit a dependency that failed a moment ago, a row "backed
off" may be due at once, and an agent may be told `retry_after: 0.01`. Equal jitter keeps half of
every wait fixed, so each attempt waits at least half the nominal backoff and the floor still
doubles per attempt. (The agents' client, idemops_client, adds its own full jitter on top of the
`retry_after` it is given, which it treats as a floor.)
"""

from __future__ import annotations

import math
import random

# 2**64 times any base in seconds is far beyond any ceiling; a larger exponent would only overflow.
_MAX_DOUBLINGS = 64
# The longest wait another system's Retry-After can impose on us: beyond it, a person should look.
RETRY_AFTER_MAX_SECONDS = 3600.0


def delay(attempt: int, *, base: float, ceiling: float, rng: random.Random | None = None) -> float:
    """Seconds to wait after the `attempt`-th attempt failed (1 for the first)."""
    if attempt < 1:
        raise ValueError(f"attempt counts from 1, got {attempt}")
    if base < 0 or ceiling < 0:
        raise ValueError(f"base and ceiling are seconds ≥ 0, got base={base}, ceiling={ceiling}")
    cap = min(ceiling, base * 2.0 ** min(attempt - 1, _MAX_DOUBLINGS))
    return cap / 2 + (rng or random).uniform(0, cap / 2)


def retry_after_header(value: str | None) -> float | None:
    """The seconds another system's `Retry-After` header asks for, bounded to [0, RETRY_AFTER_MAX_SECONDS];
    None when there is none we can read (an HTTP date, garbage, NaN): then our own backoff decides.

    Bounded because the value is the other system's to choose: an absurd one (1e12, "inf") must
    still give an agent a classified answer with a usable `retry_after`, never an overflow.
    """
    try:
        seconds = float((value or "").strip())
    except ValueError:
        return None
    if math.isnan(seconds):
        return None
    return min(max(seconds, 0.0), RETRY_AFTER_MAX_SECONDS)
