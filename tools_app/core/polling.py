"""Waiting for something another process does: ask, pause a little longer each time, give up at a deadline.

Used where a caller waits a bounded time for a row someone else moves (a follower for the
executor's outcome, an agent for its task) and by `make run` for its processes to come up.

Two ways to wait, one mechanism:

- `until` sleeps in the calling thread: for jobs, commands and in-process callers.
- `waiting` is what a call's own code uses: it does not wait, it answers a value. Either what
  follows the wait, when what it waits for has already happened, or a `Pending`: a handle on
  the wait (what to check, until when) and on what the call does next (`then`), the way DBOS's
  `start_workflow` answers a handle and Temporal's client a `WorkflowHandle`. The code that
  holds a Pending chooses how to wait: `settle` sleeps in its thread (a job, a test, an
  in-process caller); `settle_async` (an MCP call in a web process) releases the database
  thread (and with it the thread's connection), awaits on the event loop, and borrows a
  thread again only to check and then to go on. A web process has a few database threads
  (IDEMOPS_MCP_DB_THREADS); a call that slept in one would hold it for its whole wait, and
  as many waiting calls as threads would stall every other call of the process.

While calls wait, one `Watcher` per process asks the database about every row they wait on,
in one query per kind of row every IDEMOPS_WAIT_POLL_SECONDS (`Watch`: the row and an SQL
"signature" of what its waiters look at); a waiter whose row's signature changed borrows a
thread once to check whether what it waits for happened. A hundred waiting calls cost one
small query per tick, not a hundred. (No LISTEN/NOTIFY here: it would need a connection
that a pooler in transaction mode does not keep; docs/deploy.md. The MCP tasks extension's
pushes do listen, tools_app.mcp.task_watch, and poll when the notices do not come.)

Nothing is run twice: a call goes on from where it waited, with everything it had (the
record it follows, the progress it reported), so the call one reads is the call that runs.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import anyio
from django.db import connection

from tools_app.conf import conf

logger = logging.getLogger(__name__)

T = TypeVar("T")
U = TypeVar("U")


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


# --- waiting as a value --------------------------------------------------------------------------


@dataclass(frozen=True)
class Watch:
    """A row a call waits on: `signature` is SQL over the row that changes whenever what the
    waiter looks at may have (e.g. its status, and whether its lease ran out)."""

    table: str
    pk: Any
    signature: str


@dataclass(frozen=True)
class Pending(Generic[T]):
    """A call that waits: `check` (one read: has it happened?) until `deadline` (time.monotonic),
    then `then()`, whether it happened or the deadline passed. `then` answers the call's value,
    or another Pending (a call may wait more than once)."""

    check: Callable[[], bool]
    deadline: float
    then: Callable[[], T | Pending[T]]
    pause: float
    max_pause: float
    watch: Watch | None = None

    def map(self, f: Callable[[T], U | Pending[U]]) -> Pending[U]:
        """The same wait, going on with `f` of what this one comes to."""
        return Pending(self.check, self.deadline, lambda: after(self.then(), f), self.pause, self.max_pause,
                       self.watch)

    def within(self, scope: Callable[[], AbstractContextManager[object]]) -> Pending[T]:
        """The same wait, whose going on (and any wait after it) runs inside `scope()` again."""

        def then() -> T | Pending[T]:
            with scope():
                value = self.then()
            return value.within(scope) if isinstance(value, Pending) else value

        return Pending(self.check, self.deadline, then, self.pause, self.max_pause, self.watch)

    def sleep(self) -> None:
        """Wait in this thread: check after each pause until it holds or the deadline passes."""
        pause = self.pause
        while (remaining := self.deadline - time.monotonic()) > 0:
            time.sleep(min(pause, remaining))
            pause = min(pause * 2, self.max_pause)
            if self.check():
                return

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


def after(value: T | Pending[T], f: Callable[[T], U | Pending[U]]) -> U | Pending[U]:
    """`f(value)`, or once `value` is no longer pending."""
    return value.map(f) if isinstance(value, Pending) else f(value)


def waiting(stop: Callable[[], bool], then: Callable[[], T | Pending[T]], *, seconds: float, pause: float,
            max_pause: float | None = None, refresh: Callable[[], object] | None = None,
            watch: Watch | None = None) -> T | Pending[T]:
    """`then()` if `stop()` holds now, else a Pending that checks it (after `refresh()`, re-reading what
    it looks at) until it holds or `seconds` pass, then goes on with `then()`. Woken by changes of
    `watch` when it waits on the event loop, else after each pause (doubling up to `max_pause`)."""
    if stop():
        return then()

    def check() -> bool:
        if refresh is not None:
            refresh()
        return stop()

    return Pending(check, time.monotonic() + seconds, then, pause, pause if max_pause is None else max_pause, watch)


def settle(value: T | Pending[T]) -> T:
    """The value, waiting in this thread wherever it is pending."""
    while isinstance(value, Pending):
        value.sleep()
        value = value.then()
    return value


async def settle_async(in_thread: Callable[..., Awaitable[Any]], fn: Callable[..., T | Pending[T]], /,
                       *args: Any, **kwargs: Any) -> T:
    """`fn(*args, **kwargs)` run by `in_thread` (which runs sync code in a thread and awaits it);
    where it is pending, wait here holding no thread, then go on in a thread."""
    value: T | Pending[T] = await in_thread(fn, *args, **kwargs)
    while isinstance(value, Pending):
        await value.wait(in_thread)
        value = await in_thread(value.then)
    return value


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
