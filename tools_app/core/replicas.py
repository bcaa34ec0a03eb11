"""Which database a read goes to: the primary, or a streaming replica.

A read that decides something (a claim, a transition, an operator's queue, finding a record before
acting on it) reads the primary: a replica may be a moment behind, and a decision taken on what it
says would act on a past that has since changed. A read that only shows or exports (the auditors'
API and CSV exports, the console's evidence lists, its dashboard) may read a replica. The choice is
made where the read is written, never guessed here:

    rows = IdempotencyRecord.objects.using(replicas.alias())   # one queryset
    with replicas.reading():                                    # every read in a block
        trend = trends.trend(...)

`alias()` answers the primary when no replica is configured (IDEMOPS_DATABASE_REPLICA_URLS) or when
each one lags more than IDEMOPS_DATABASE_REPLICA_MAX_LAG_SECONDS or cannot be reached: a lagging
replica is skipped, not waited for. Each replica's lag is asked at most once a second per process.

`Router` (DATABASE_ROUTERS) makes the rest safe: a row read from a replica is written back to the
primary, rows of the primary and of a replica may be related, and nothing is migrated on a replica.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections, models

logger = logging.getLogger(__name__)

PREFIX = "replica"
CHECK_EVERY_SECONDS = 1.0

# Replay lag as the replica sees it: nothing received but not yet replayed is no lag at all (an idle
# primary sends nothing, and its last transaction's time only ages); otherwise, how old the last
# replayed transaction is.
LAG_SQL = """
SELECT CASE WHEN NOT pg_is_in_recovery() THEN 0
            WHEN pg_last_wal_receive_lsn() IS NOT DISTINCT FROM pg_last_wal_replay_lsn() THEN 0
            ELSE coalesce(extract(epoch FROM clock_timestamp() - pg_last_xact_replay_timestamp()), 'Infinity')
       END
"""

_reading: ContextVar[str | None] = ContextVar("idemops_replica_reading", default=None)
_checked: dict[str, tuple[float, bool]] = {}  # alias -> (monotonic time of the check, usable)
_lock = threading.Lock()


def aliases() -> list[str]:
    """The replicas' database aliases, in the order of IDEMOPS_DATABASE_REPLICA_URLS."""
    return [alias for alias in settings.DATABASES if alias.startswith(PREFIX)]


def alias() -> str:
    """A replica that is reachable and not lagging, else the primary (DEFAULT_DB_ALIAS)."""
    for name in aliases():
        if _usable(name):
            return name
    return DEFAULT_DB_ALIAS


@contextmanager
def reading() -> Iterator[str]:
    """Every read in the block that names no database goes to `alias()`; writes still go to the primary."""
    chosen = alias()
    token = _reading.set(chosen)
    try:
        yield chosen
    finally:
        _reading.reset(token)


def lag_seconds(name: str) -> float:
    """How far behind the primary the replica `name` replays, in seconds (0 for the primary itself)."""
    with connections[name].cursor() as cursor:
        cursor.execute(LAG_SQL)
        row = cursor.fetchone()
    return float(row[0]) if row is not None else float("inf")


def _usable(name: str) -> bool:
    now = time.monotonic()
    with _lock:
        checked = _checked.get(name)
        if checked is not None and now - checked[0] < CHECK_EVERY_SECONDS:
            return checked[1]
    try:
        lag = lag_seconds(name)
        usable = lag <= settings.IDEMOPS.database_replica_max_lag_seconds
        if not usable:
            logger.warning("replica %s is %.1f s behind the primary: its reads go to the primary", name, lag)
    except DatabaseError as exc:
        usable = False
        logger.warning("replica %s cannot be reached (%s): its reads go to the primary", name, type(exc).__name__)
        connections[name].close()
    with _lock:
        _checked[name] = (now, usable)
    return usable


def forget_checks() -> None:
    """Ask each replica's lag again at the next read (tests, after pausing or resuming a replica)."""
    with _lock:
        _checked.clear()


class Router:
    """Reads go where the call site said (`.using`, `reading()`), else to the primary; writes always to the
    primary; migrations only there."""

    def db_for_read(self, model: type[models.Model], **hints: Any) -> str | None:
        # None lets Django follow a related row's own database (a row read from a replica fetches its
        # relations there too), and otherwise take the primary.
        return _reading.get()

    def db_for_write(self, model: type[models.Model], **hints: Any) -> str:
        return DEFAULT_DB_ALIAS

    def allow_relation(self, obj1: models.Model, obj2: models.Model, **hints: Any) -> bool:
        # Replicas hold the primary's rows: a row read from one may refer to a row of another.
        return True

    def allow_migrate(self, db: str, app_label: str, model_name: str | None = None, **hints: Any) -> bool:
        return db == DEFAULT_DB_ALIAS
