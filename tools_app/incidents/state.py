"""What each process knows of the pauses and breakers: a snapshot re-read at most every
IDEMOPS_INCIDENT_STATE_SECONDS (one query per table), so the hot path of a write asks the database
nothing new, and a pause or an opened breaker applies in every process within that time.

A state that cannot be read (the tables missing, a corrupt row) holds nothing back: calls run as
normal, the failure is logged, and `problem` says so to the console.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import DatabaseError, connection, transaction

from tools_app.conf import conf
from tools_app.core import db
from tools_app.incidents.models import BreakerState, Downstream, Pause

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Breaker:
    state: str
    failures: int
    next_probe_at: datetime | None
    probe_until: datetime | None
    last_failure: str


@dataclass(frozen=True)
class Snapshot:
    pauses: dict[tuple[str, str], str] = field(default_factory=dict)  # (scope, target) -> reason
    breakers: dict[str, Breaker] = field(default_factory=dict)  # only those not closed with 0 failures
    read_at: datetime | None = None  # the database's time of the read
    taken: float = 0.0  # time.monotonic() of the read
    problem: str = ""  # why the state could not be read (calls run as normal meanwhile)

    def now(self) -> datetime | None:
        """The database's time now, as far as this snapshot tells (its read time plus what passed since)."""
        return None if self.read_at is None else self.read_at + timedelta(seconds=time.monotonic() - self.taken)


_snapshot = Snapshot()
_lock = threading.Lock()
# Tools that declared no downstream, by the host their requests went to (toolkit.downstream tells us).
_learned: dict[str, str] = {}


def snapshot(*, fresh: bool = False) -> Snapshot:
    """The current state, re-read when older than IDEMOPS_INCIDENT_STATE_SECONDS (or `fresh`)."""
    global _snapshot
    current = _snapshot
    if fresh or time.monotonic() - current.taken >= conf().incident_state_seconds:
        with _lock:
            if fresh or _snapshot is current:
                _snapshot = _read()
        current = _snapshot
    return current


def forget() -> None:
    """Read the state afresh at the next question (this process just changed it)."""
    global _snapshot
    _snapshot = Snapshot()


def _read() -> Snapshot:
    """One query: every pause, every breaker not plainly closed, and the database's time."""
    try:
        # A savepoint inside a caller's transaction: a failed read must not break it.
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                f"SELECT 'pause', scope, target, reason, NULL::integer, NULL::timestamptz, NULL::timestamptz "
                f"FROM {db.table(Pause)} "
                f"UNION ALL SELECT 'breaker', name, state, last_failure, failures, next_probe_at, probe_until "
                f"FROM {db.table(Downstream)} WHERE state <> %s OR failures > 0 "
                "UNION ALL SELECT 'now', '', '', '', NULL, statement_timestamp(), NULL", [BreakerState.CLOSED])
            rows = cursor.fetchall()
        pauses: dict[tuple[str, str], str] = {}
        breakers: dict[str, Breaker] = {}
        read_at = None
        problems = []
        for kind, first, second, text, failures, at, until in rows:
            if kind == "pause":
                pauses[(first, second)] = text
            elif kind == "breaker":
                if second not in BreakerState.values:
                    # That breaker alone is left out (its downstream's calls run as normal); the rest holds.
                    problems.append(f"downstream {first!r} has an unknown breaker state {second!r}")
                    continue
                breakers[first] = Breaker(second, failures, at, until, text)
            else:
                read_at = at
        if problems:
            logger.error("breaker states left out (calls to them run as normal): %s", "; ".join(problems))
        return Snapshot(pauses, breakers, read_at, time.monotonic(), problem="; ".join(problems)[:500])
    except DatabaseError as exc:
        logger.error("the pauses and breakers could not be read (%s); calls run as normal", exc)
        return Snapshot(taken=time.monotonic(), problem=f"{type(exc).__name__}: {exc}"[:500])


def learn(tool: str, downstream: str) -> None:
    """`tool`, which declared no downstream, sent a request to `downstream` (a URL's host)."""
    if _learned.get(tool) != downstream:
        _learned[tool] = downstream


def downstream_of(tool: str, declared: str | None) -> str | None:
    return declared or _learned.get(tool)


def breaker_open(downstream: str) -> bool:
    """Whether `downstream`'s breaker holds calls back (as this process last read it)."""
    seen = snapshot().breakers.get(downstream)
    return seen is not None and seen.state != BreakerState.CLOSED
