"""The database's clock: the one clock every lease, expiry and due time is taken from.

Several hosts run idemops against one database, and their clocks disagree (NTP keeps them
close, a paused VM or a misconfigured host does not). A web process whose clock runs ahead
would take a live executor's lease for dead; one running behind would write leases that
outlive their holder. So the times that decide who may act (a lease's expiry, a key's
retention, an approval's deadline, a second-factor code's freshness for step-up, when a
reconciliation, a retry or a delivery is due, whether a queued job was lost) are written and
compared by PostgreSQL, never by the host:

- `NOW` and `later(seconds)` are SQL expressions (STATEMENT_TIMESTAMP(), and that plus an
  interval) for the ORM and for core.db.transition, in the statement that writes or
  compares the time;
- `read()` asks the database for its time, for the few places that must hold a time in
  Python (a deadline shown to a person, an age); rows read with `annotate(read_at=NOW)`
  carry the database's time of the read, to compare their own times with.

Timestamps that only record when something happened (an audit event's `created_at`) keep
the host's clock: nothing is decided by them.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from functools import lru_cache

from django.db import connection
from django.db.models import Expression
from django.db.models.functions import Now

# The start of the current statement: the same instant for every row a statement writes.
NOW = Now()


def later(seconds: float | timedelta) -> Expression:
    """The database's time `seconds` from now, as an SQL expression (the same object for the same
    delay: expressions are never changed in place, and core.db compiles each one once)."""
    return _later(seconds if isinstance(seconds, timedelta) else timedelta(seconds=seconds))


@lru_cache(maxsize=256)
def _later(delta: timedelta) -> Expression:
    return Now() + delta


def read() -> datetime:
    """The database's current time (one round trip)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement_timestamp()")
        now: datetime = cursor.fetchone()[0]
        return now


def read_at(obj: object) -> datetime:
    """The database's time when `obj` was read, if the read asked for it (`read_at`); else now."""
    return getattr(obj, "read_at", None) or read()
