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
    """Renews a lease from a thread of its own while work runs; notices when it is lost.

    `renew` is the holder's guarded UPDATE (extend the expiry where the owner
    is still us); False means the lease is no longer ours: `lost` is set and
    the beat stops. A thread of its own, so work that blocks (a slow page, a
    slow downstream call) keeps its lease. It touches the database only after
    the first interval, so short work costs nothing.
    """

    def __init__(self, renew: Callable[[], bool], interval: float, name: str):
        self.renew = renew
        self.interval = interval
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=name, daemon=True)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._thread.join()

    def _beat(self) -> None:
        try:
            while not self._stop.wait(self.interval):
                try:
                    renewed = self.renew()
                except Exception as exc:
                    # A database hiccup: try again next beat; if it lasts, the
                    # lease lapses and the holder's guarded writes fail, which is safe.
                    logger.warning("%s: renewal failed (%s); retrying", self._thread.name, type(exc).__name__)
                    connections.close_all()  # a broken connection is replaced at the next beat
                    continue
                if not renewed:
                    logger.warning("%s: the lease is no longer ours (taken over, or the work was cancelled)",
                                   self._thread.name)
                    self.lost.set()
                    return
        finally:
            connections.close_all()  # this thread's connections only
