"""Waiting for something another process does: ask, pause a little longer each time, give up at a deadline.

Used where a caller waits a bounded time for a row someone else moves (a follower for the
executor's outcome, an agent for its task) and by `make run` for its processes to come up.
"""

from __future__ import annotations

import time
from collections.abc import Callable


def until(stop: Callable[[], bool], *, seconds: float, pause: float, max_pause: float | None = None,
          refresh: Callable[[], object] | None = None) -> bool:
    """Ask `stop` now and after each pause until it says True or `seconds` have passed.

    The pause starts at `pause` and doubles up to `max_pause` (default: it stays `pause`), and is
    cut short at the deadline. `refresh`, if given, runs after each pause and before `stop` is
    asked again (re-read the row `stop` looks at). Returns whether `stop` said True.
    """
    deadline = time.monotonic() + seconds
    ceiling = pause if max_pause is None else max_pause
    while not stop():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        time.sleep(min(pause, remaining))
        pause = min(pause * 2, ceiling)
        if refresh is not None:
            refresh()
    return True
