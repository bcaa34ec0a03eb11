"""Leases: the one mechanism that says who may run something, and for how long.

An executor of a write (tools_app.engine) and a worker running a long
task (tools_app.tasks) each hold a lease on their row: an owner name
(`new_owner`) and an expiry (`expiry`), set by the conditional UPDATE that
gave them the work. While the work runs, a `Heartbeat` renews the lease; if
the process dies (SIGKILL, OOM, a lost database connection), renewals stop
and the lease runs out, and whoever finds it expired (a follower, a sweep)
takes over through a guarded transition. Every write of the holder is
guarded by its owner name, so a holder presumed dead that comes back writes
nothing.

Clocks: an expiry is the database's time (core.clock), written by the UPDATE
that takes or renews the lease and compared in SQL (or with the database's
time of the read), so the hosts' clocks may disagree: a process whose clock
runs ahead does not take a live lease for dead, nor does one running behind
write a lease that outlives its holder.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable

from django.db import connections
from django.db.models import Expression

from tools_app.core import clock

logger = logging.getLogger(__name__)


def new_owner() -> str:
    """A lease owner name: unique per holding, readable for operators (host:pid:random)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def expiry(lease_seconds: float) -> Expression:
    """When a lease taken or renewed now runs out: the database's time plus the lease, as the SQL
    expression the statement that takes or renews it writes."""
    return clock.later(lease_seconds)


def heartbeat_interval(heartbeat_seconds: float, lease_seconds: float) -> float:
    """How often to renew: as configured, but at least three times per lease, so
    one slow or failed renewal does not let the lease run out."""
    return min(heartbeat_seconds, lease_seconds / 3)


class Heartbeat:
    """Renews a lease while work runs; notices when it is lost.

    `renew` is the holder's guarded UPDATE (extend the expiry where the owner
    is still us); False means the lease is no longer ours: `lost` is set and
    the beat stops. Renewals run on the process's one keeper thread (not the
    worker's), so work that blocks (a slow page, a slow downstream call) keeps
    its lease, and holding a lease costs no thread start: most holdings end
    before their first beat and never touch the database.
    """

    def __init__(self, renew: Callable[[], bool], interval: float, name: str):
        self.renew = renew
        self.interval = interval
        self.name = name
        self.lost = threading.Event()
        self._due = 0.0
        self._stopped = False
        # Held while a renewal of this lease runs: leaving waits for one in flight, so no renewal
        # of ours lands after the holder moved on (to its guarded final write, or the next step).
        self._renewing = threading.Lock()

    def __enter__(self) -> Heartbeat:
        _keeper().hold(self)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stopped = True
        _keeper().release(self)
        with self._renewing:
            pass

    def _beat(self) -> None:
        """One renewal, on the keeper's thread."""
        with self._renewing:
            if self._stopped:
                return
            try:
                renewed = self.renew()
            except Exception as exc:
                # A database hiccup: try again next beat; if it lasts, the
                # lease lapses and the holder's guarded writes fail, which is safe.
                logger.warning("%s: renewal failed (%s); retrying", self.name, type(exc).__name__)
                connections.close_all()  # the keeper's connection only; a broken one is replaced next beat
                return
            if not renewed:
                logger.warning("%s: the lease is no longer ours (taken over, or the work was cancelled)", self.name)
                self.lost.set()
                self._stopped = True


class _Keeper:
    """The one thread of a process that renews every lease held in it, each at its own interval."""

    def __init__(self) -> None:
        self._held: dict[int, Heartbeat] = {}
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="lease-keeper", daemon=True)
        self._thread.start()

    def hold(self, beat: Heartbeat) -> None:
        with self._changed:
            beat._due = time.monotonic() + beat.interval
            self._held[id(beat)] = beat
            self._changed.notify()

    def release(self, beat: Heartbeat) -> None:
        with self._changed:
            self._held.pop(id(beat), None)

    def _run(self) -> None:
        while True:
            for beat in self._due():
                beat._beat()
                if beat.lost.is_set():
                    self.release(beat)

    def _due(self) -> list[Heartbeat]:
        """Sleep until some held lease is due for renewal; while none is held, hold no connection."""
        while True:
            with self._changed:
                if self._held:
                    now = time.monotonic()
                    due = [beat for beat in self._held.values() if beat._due <= now]
                    for beat in due:
                        beat._due = now + beat.interval
                    if due:
                        return due
                    self._changed.wait(min(beat._due for beat in self._held.values()) - now)
                    continue
            connections.close_all()  # this thread's connection, until a lease needs one again
            with self._changed:
                while not self._held:
                    self._changed.wait()


_keepers: dict[int, _Keeper] = {}
_keepers_lock = threading.Lock()


def _keeper() -> _Keeper:
    # One per process: a forked child (a django-q2 worker) starts its own.
    pid = os.getpid()
    keeper = _keepers.get(pid)
    if keeper is None:
        with _keepers_lock:
            keeper = _keepers.get(pid)
            if keeper is None:
                keeper = _keepers[pid] = _Keeper()
    return keeper


def _forget_keepers_in_child() -> None:
    global _keepers_lock
    _keepers.clear()
    _keepers_lock = threading.Lock()  # the parent may have held it at the fork


os.register_at_fork(after_in_child=_forget_keepers_in_child)
