"""Waiting for something another process does: ask, pause a little longer each time, give up at a deadline.

Used where a caller waits a bounded time for a row someone else moves (a follower for the
executor's outcome, an agent for its task) and by `make run` for its processes to come up.

Two ways to wait, one mechanism:

- `until` sleeps in the calling thread: for jobs, commands and in-process callers.
- `wait` is what a call's own code uses. Run by `run_async` (an MCP call in a web process),
  it does not sleep: it raises `WaitElsewhere`, `run_async` releases the database thread
  (and with it the thread's connection), awaits on the event loop, and runs the call again
  once the awaited thing happened or the deadline passed. A web process has a few database
  threads (IDEMOPS_MCP_DB_THREADS); a call that slept in one would hold it for its whole
  wait, and as many waiting calls as threads would stall every other call of the process.

While calls wait, one `Watcher` per process asks the database about every row they wait on,
in one query per kind of row every IDEMOPS_WAIT_POLL_SECONDS (`Watch`: the row and an SQL
"signature" of what its waiters look at); a waiter whose row's signature changed borrows a
thread once to check whether what it waits for happened. A hundred waiting calls cost one
small query per tick, not a hundred. (No LISTEN/NOTIFY here: it would need a connection
that a pooler in transaction mode does not keep; docs/deploy.md. The MCP tasks extension's
pushes do listen, tools_app.mcp.task_watch, and poll when the notices do not come.)

A call run again must be safe to repeat up to its wait, which holds for the callers here:
the wait is the first thing they do that takes time, after reads and idempotent claims.
What must survive the repetition (the first run's `replayed`, the progress already
reported) is kept with `carried`.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
from django.db import connection

from idemops.conf import conf

logger = logging.getLogger(__name__)

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

    def __init__(self) -> None:
        self.deadlines: dict[str, float] = {}
        self.carried: dict[str, Any] = {}


_current: contextvars.ContextVar[_Call | None] = contextvars.ContextVar("polling_call", default=None)


@dataclass(frozen=True)
class Watch:
    """A row a call waits on: `signature` is SQL over the row that changes whenever what the
    waiter looks at may have (e.g. its status, and whether its lease ran out)."""

    table: str
    pk: Any
    signature: str


class WaitElsewhere(Exception):  # not an error: a request to the caller
    """Raised by `wait` inside a call run by `run_async`: wait for `check` out of this thread,
    then run the call again."""

    def __init__(self, check: Callable[[], bool], deadline: float, pause: float, max_pause: float,
                 watch: Watch | None = None):
        super().__init__("wait outside the database thread")
        self.check = check
        self.deadline = deadline
        self.pause = pause
        self.max_pause = max_pause
        self.watch = watch

    async def wait(self, in_thread: Callable[..., Awaitable[Any]]) -> None:
        """Wait on the event loop; `check` borrows a thread for one read when the watched row
        changed (or, without a watch, after each pause)."""
        if self.watch is not None:
            await Watcher.of_this_loop(in_thread).wait(self.watch, self.check, self.deadline)
            return
        pause = self.pause
        while (remaining := self.deadline - time.monotonic()) > 0:
            await anyio.sleep(min(pause, remaining))
            pause = min(pause * 2, self.max_pause)
            if await in_thread(self.check):
                return


class _Waiter:
    def __init__(self) -> None:
        self.seen: object = _UNSEEN
        self.changed = asyncio.Event()


_UNSEEN = object()


class Watcher:
    """One per process (event loop): asks the database about every watched row, one query per
    kind of row per tick, and wakes the waiters whose row's signature changed."""

    _of_loop: dict[asyncio.AbstractEventLoop, Watcher] = {}

    @classmethod
    def of_this_loop(cls, in_thread: Callable[..., Awaitable[Any]]) -> Watcher:
        loop = asyncio.get_running_loop()
        if loop not in cls._of_loop:
            cls._of_loop = {other: w for other, w in cls._of_loop.items() if not other.is_closed()}
            cls._of_loop[loop] = cls(in_thread)
        return cls._of_loop[loop]

    def __init__(self, in_thread: Callable[..., Awaitable[Any]]):
        self.in_thread = in_thread
        self.watched: dict[tuple[str, str], dict[Any, list[_Waiter]]] = {}
        self.running: asyncio.Task[None] | None = None

    async def wait(self, watch: Watch, check: Callable[[], bool], deadline: float) -> None:
        """Until `check` holds (asked once first, then after each change of the row) or the deadline."""
        waiter = _Waiter()
        rows = self.watched.setdefault((watch.table, watch.signature), {})
        rows.setdefault(watch.pk, []).append(waiter)
        if self.running is None or self.running.done():
            self.running = asyncio.get_running_loop().create_task(self._run())
        try:
            while (remaining := deadline - time.monotonic()) > 0:
                try:
                    await asyncio.wait_for(waiter.changed.wait(), remaining)
                except TimeoutError:
                    return
                waiter.changed.clear()
                if await self.in_thread(check):
                    return
        finally:
            rows[watch.pk].remove(waiter)
            if not rows[watch.pk]:
                del rows[watch.pk]

    async def _run(self) -> None:
        while any(self.watched.values()):
            await asyncio.sleep(conf().wait_poll_seconds)
            for (table, signature), rows in list(self.watched.items()):
                if not rows:
                    continue
                try:
                    found = await self.in_thread(_signatures, table, signature, list(rows))
                except Exception as exc:
                    # The database is away: every waiter checks for itself, and its call hears of the outage.
                    logger.warning("watching rows of %s failed (%s); waking their waiters", table, type(exc).__name__)
                    found = None
                for pk, waiters in list(rows.items()):
                    current = None if found is None else found.get(pk)
                    for waiter in waiters:
                        if found is None or waiter.seen != current:
                            waiter.seen = current
                            waiter.changed.set()


def _signatures(table: str, signature: str, pks: list[Any]) -> dict[Any, Any]:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT id, {signature} FROM {table} WHERE id = ANY(%s)", [pks])
        return dict(cursor.fetchall())


def wait(name: str, stop: Callable[[], bool], *, seconds: float, pause: float, max_pause: float | None = None,
         refresh: Callable[[], object] | None = None, watch: Watch | None = None) -> bool:
    """`until`, for a call's own code: in a call run by `run_async` the wait happens outside the
    thread (see the module's docstring), woken by changes of `watch` if given, else after each
    pause. `name` tells the call's waits apart: the deadline of each is set the first time the
    call reaches it and kept when the call runs again."""
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

    raise WaitElsewhere(check, deadline, pause, pause if max_pause is None else max_pause, watch)


def carried(name: str, first: Callable[[], T]) -> T:
    """A value of the call that survives its runs again under `run_async`: `first()` the first
    time, the same object after (outside `run_async`, simply `first()`)."""
    call = _current.get()
    if call is None:
        return first()
    if name not in call.carried:
        call.carried[name] = first()
    value: T = call.carried[name]  # what `first()` made for this name
    return value


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
            result: T = await in_thread(attempt)
            return result
        except WaitElsewhere as elsewhere:
            await elsewhere.wait(in_thread)
