"""Waiting for something another process does: ask, pause a little longer each time, give up at a deadline.

Used where a caller waits a bounded time for a row someone else moves (a follower for the
executor's outcome, an agent for its task) and by `make run` for its processes to come up.

Two ways to wait, one mechanism:

- `until` sleeps in the calling thread: for jobs, commands and in-process callers.
- `wait` is what a call's own code uses. Run by `run_async` (an MCP call in a web process),
  it does not sleep: it raises `WaitElsewhere`, `run_async` releases the database thread
  (and with it the thread's connection), awaits on the event loop between short checks
  that each borrow a thread for one read, and runs the call again once the awaited thing
  happened or the deadline passed. A web process has a few database threads
  (IDEMOPS_MCP_DB_THREADS); a call that slept in one would hold it for its whole wait, and
  as many waiting calls as threads would stall every other call of the process.

A call run again must be safe to repeat up to its wait, which holds for the callers here:
the wait is the first thing they do that takes time, after reads and idempotent claims.
What must survive the repetition (the first run's `replayed`, the progress already
reported) is kept with `carried`.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio

T = TypeVar("T")


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


# --- waiting without holding a thread ----------------------------------------------------------


class _Call:
    """One call run by `run_async`: the deadline of each of its waits, and what it carries over."""

    def __init__(self):
        self.deadlines: dict[str, float] = {}
        self.carried: dict[str, Any] = {}


_current: contextvars.ContextVar[_Call | None] = contextvars.ContextVar("polling_call", default=None)


class WaitElsewhere(Exception):  # noqa: N818  (not an error: a request to the caller)
    """Raised by `wait` inside a call run by `run_async`: wait for `check` out of this thread,
    then run the call again."""

    def __init__(self, check: Callable[[], bool], deadline: float, pause: float, max_pause: float):
        super().__init__("wait outside the database thread")
        self.check = check
        self.deadline = deadline
        self.pause = pause
        self.max_pause = max_pause

    async def wait(self, in_thread: Callable[..., Awaitable[Any]]) -> None:
        """Pause on the event loop; between pauses, `check` borrows a thread for one read."""
        pause = self.pause
        while (remaining := self.deadline - time.monotonic()) > 0:
            await anyio.sleep(min(pause, remaining))
            pause = min(pause * 2, self.max_pause)
            if await in_thread(self.check):
                return


def wait(name: str, stop: Callable[[], bool], *, seconds: float, pause: float, max_pause: float | None = None,
         refresh: Callable[[], object] | None = None) -> bool:
    """`until`, for a call's own code: in a call run by `run_async` the wait happens outside the
    thread (see the module's docstring). `name` tells the call's waits apart: the deadline of
    each is set the first time the call reaches it and kept when the call runs again."""
    call = _current.get()
    if call is None:
        return until(stop, seconds=seconds, pause=pause, max_pause=max_pause, refresh=refresh)
    if stop():
        return True
    deadline = call.deadlines.setdefault(name, time.monotonic() + seconds)
    if time.monotonic() >= deadline:
        return False

    def check() -> bool:
        if refresh is not None:
            refresh()
        return stop()

    raise WaitElsewhere(check, deadline, pause, pause if max_pause is None else max_pause)


def carried(name: str, first: Callable[[], T]) -> T:
    """A value of the call that survives its runs again under `run_async`: `first()` the first
    time, the same object after (outside `run_async`, simply `first()`)."""
    call = _current.get()
    if call is None:
        return first()
    if name not in call.carried:
        call.carried[name] = first()
    return call.carried[name]


async def run_async(in_thread: Callable[..., Awaitable[Any]], fn: Callable[..., T], /, *args: Any,
                    **kwargs: Any) -> T:
    """Run the sync call `fn(*args, **kwargs)` with `in_thread` (which runs sync code in a thread
    and awaits it); where it waits (`wait`), wait here holding no thread, then run it again."""
    call = _Call()

    def attempt() -> T:
        token = _current.set(call)
        try:
            return fn(*args, **kwargs)
        finally:
            _current.reset(token)

    while True:
        try:
            return await in_thread(attempt)
        except WaitElsewhere as elsewhere:
            await elsewhere.wait(in_thread)
