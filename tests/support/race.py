"""The race harness: N calls released at once behind a barrier, each in its own thread with its own
database connection, and every answer and every error collected.

A concurrency test counts what came back (`len(race.results) + len(race.errors) == N`, or
`race.answered(N)`): a call that died in its thread, or never got past the barrier, is an answer
missing, not a pass that only compared the answers that did arrive."""

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.db import connection, connections


@dataclass
class Race:
    calls: int
    results: list[Any] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)
    still_running: int = 0

    def answered(self, expected: int | None = None) -> bool:
        """Every call came back, with a result or an error, and none is still running."""
        expected = self.calls if expected is None else expected
        return self.still_running == 0 and len(self.results) + len(self.errors) == expected


def race(*calls: Callable[[], Any], timeout: float = 60) -> Race:
    """Run `calls` at once (a barrier releases them together) and wait for all of them."""
    outcome, lock = Race(calls=len(calls)), threading.Lock()
    barrier = threading.Barrier(len(calls))

    def run(call: Callable[[], Any]) -> None:
        try:
            barrier.wait(timeout)
            value = call()
            with lock:
                outcome.results.append(value)
        except BaseException as exc:  # collected and counted by the caller
            with lock:
                outcome.errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(call,), daemon=True) for call in calls]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    outcome.still_running = sum(thread.is_alive() for thread in threads)
    return outcome


def in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    """Start `fn()` in another thread (another connection, as a concurrent caller); its result lands in
    the list once it returns. The caller joins the thread."""
    results: list[Any] = []

    def target() -> None:
        try:
            results.append(fn())
        finally:
            connections.close_all()

    thread = threading.Thread(target=target)
    thread.start()
    return thread, results


def wait_for_lock_waiters(count: int, timeout: float = 10) -> None:
    """Until `count` sessions of the test database wait on a lock (a claim queued behind another)."""
    deadline = time.monotonic() + timeout
    with connection.cursor() as cursor:
        while time.monotonic() < deadline:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                           "AND datname = current_database()")
            if cursor.fetchone()[0] >= count:
                return
            time.sleep(0.02)
    raise AssertionError("no claim is waiting on the unique index")
