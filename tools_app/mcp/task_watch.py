"""Hearing task changes in a web process, to push them to MCP clients that wait or listen.

Tasks change in django-q2 workers (and in other web processes), so the news
has to cross processes. Every task transition notifies the PostgreSQL channel
tasks.CHANGES_CHANNEL with the task's id, in its own statement (so only
committed changes are heard); a heartbeat whose progress moved does too.
Each web process keeps one connection that LISTENs on it (`TaskWatch`, started
by the first waiter) and wakes the waiters of that id. Waiting holds no
database thread: only the re-read after a wake-up does, briefly.

The notice is a hint, not the news: a waiter re-reads the task through its
tenant and compares it with what it last saw. Notices sent while the
listener reconnects are lost, so every waiter also re-reads at least every
IDEMOPS_TASK_WATCH_POLL_SECONDS, and all waiters re-read once the listener is
back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import AsyncGenerator, Callable, Iterable
from typing import Any

import anyio
import psycopg
from django.db import connections

from tools_app import tasks
from tools_app.conf import conf
from tools_app.core import backoff
from tools_app.mcp.runtime import in_db_thread
from tools_app.tasks.models import Task
from tools_app.toolkit.calls import Caller

logger = logging.getLogger(__name__)


class Waiter:
    """A set of task ids someone waits on; `wait` returns after a notice for one of them (or a timeout)."""

    def __init__(self, watch: TaskWatch, task_ids: Iterable[str]):
        self._watch = watch
        self.task_ids = set(task_ids)
        self._event = anyio.Event()

    def wake(self) -> None:
        self._event.set()

    async def wait(self, timeout: float) -> None:
        with anyio.move_on_after(timeout):
            await self._event.wait()
        # A notice from now on wakes the next wait; one that came before is covered by the re-read
        # that follows this wait (the change it announced had committed before it was sent).
        self._event = anyio.Event()

    def close(self) -> None:
        self._watch._remove(self)


class TaskWatch:
    """The process's LISTEN connection and the waiters it wakes."""

    def __init__(self, channel: str):
        self.channel = channel
        self._waiters: dict[str, set[Waiter]] = defaultdict(set)
        self._listener: asyncio.Task[None] | None = None
        self.listening = False

    def waiter(self, task_ids: Iterable[str]) -> Waiter:
        """Register before reading the tasks, so no change between the read and the wait is missed."""
        self._ensure_listener()
        waiter = Waiter(self, task_ids)
        for task_id in waiter.task_ids:
            self._waiters[task_id].add(waiter)
        return waiter

    def _remove(self, waiter: Waiter) -> None:
        for task_id in waiter.task_ids:
            waiting = self._waiters.get(task_id)
            if waiting is not None:
                waiting.discard(waiter)
                if not waiting:
                    del self._waiters[task_id]

    def _wake(self, task_id: str) -> None:
        for waiter in list(self._waiters.get(task_id, ())):
            waiter.wake()

    def _wake_all(self) -> None:
        for waiting in list(self._waiters.values()):
            for waiter in list(waiting):
                waiter.wake()

    def _ensure_listener(self) -> None:
        if self._listener is None or self._listener.done():
            self._listener = asyncio.get_running_loop().create_task(self._listen(), name="task-watch")

    async def _listen(self) -> None:
        failures = 0
        while True:
            try:
                async with await _connect() as connection:
                    await connection.execute(f"LISTEN {self.channel}")
                    self.listening, failures = True, 0
                    self._wake_all()  # what changed while nobody listened is read again
                    async for notice in connection.notifies():
                        self._wake(notice.payload)
            except Exception as exc:  # the database is away, or the connection broke: try again later
                failures += 1
                logger.warning("task watch: listening on %s failed (%s); again in a moment, waiters poll "
                               "meanwhile", self.channel, type(exc).__name__)
            finally:
                self.listening = False
            await asyncio.sleep(backoff.delay(max(failures, 1), base=0.5, ceiling=30))


async def _connect() -> psycopg.AsyncConnection[Any]:
    """The listening connection. A LISTEN lives in its session: behind a pooler in transaction mode it
    needs a direct one (IDEMOPS_DATABASE_LISTEN_URL); otherwise it is made like Django's own."""
    listen_url = conf().database_listen_url
    if listen_url:
        return await psycopg.AsyncConnection.connect(listen_url, autocommit=True)
    params = await in_db_thread(_connection_params)
    return await psycopg.AsyncConnection.connect(autocommit=True, **params)


def _connection_params() -> dict[str, Any]:
    """Django's own connection settings for a plain (async) psycopg connection."""
    params = connections["default"].get_connection_params()
    for django_only in ("cursor_factory", "context", "prepare_threshold"):
        params.pop(django_only, None)
    return params


watch = TaskWatch(tasks.CHANGES_CHANNEL)


# --- following tasks: what a waiting request sees ---------------------------------------------------


# What change_key reads: version, progress done and total, progress message, pause requested.
ChangeKey = tuple[int, float | None, float | None, str, str]


def change_key(task: Task) -> ChangeKey:
    """What a client would notice: a transition (version) or progress inside a step."""
    return (task.version, task.progress_done, task.progress_total, task.progress_message, task.pause_requested)


def _read(caller: Caller, task_ids: list[str], seen: dict[str, ChangeKey], shape: Callable[[Task], Any]
          ) -> tuple[list[tuple[Task, Any]], list[str]]:
    """The tasks that changed since `seen` (with their shape, computed here, in the database thread),
    and the ids still followed (gone or other tenants' ids drop out)."""
    changed: list[tuple[Task, Any]] = []
    present: list[str] = []
    for task in Task.objects.filter(tenant_id=caller.tenant_id, pk__in=task_ids).select_related("record"):
        task_id = str(task.pk)
        present.append(task_id)
        key = change_key(task)
        if seen.get(task_id) != key:
            seen[task_id] = key
            changed.append((task, shape(task)))
    return changed, present


async def follow(caller: Caller, task_ids: list[str], shape: Callable[[Task], Any], *,
                 until: Callable[[Task], bool], max_seconds: float | None = None
                 ) -> AsyncGenerator[list[tuple[Task, Any]], None]:
    """Yield the caller's tasks among `task_ids` each time some of them change (first: as they are),
    until every one satisfies `until` (or is gone), or `max_seconds` pass."""
    deadline = None if max_seconds is None else time.monotonic() + max_seconds
    seen: dict[str, ChangeKey] = {}
    done: set[str] = set()
    waiter = watch.waiter(task_ids)
    try:
        while True:
            changed, present = await in_db_thread(_read, caller, task_ids, seen, shape)
            done.update(str(task.pk) for task, _ in changed if until(task))
            if changed:
                yield changed
            if set(present) <= done:
                return
            left = conf().task_watch_poll_seconds if deadline is None else deadline - time.monotonic()
            if left <= 0:
                return
            await waiter.wait(min(left, conf().task_watch_poll_seconds))
    finally:
        waiter.close()
