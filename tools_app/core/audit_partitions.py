"""The audit table's monthly partitions: created ahead, and emptied once archived.

`tools_app_auditevent` is a PostgreSQL table partitioned by RANGE on `created_at`
(migration 0011_i28c_audit_partitions), one partition per calendar month (UTC),
named `tools_app_auditevent_yYYYYmMM`, plus a DEFAULT partition that catches an
event no month partition holds, so that a write never fails for want of one.

- `ensure` creates the partitions of this month and of the next
  IDEMOPS_AUDIT_PARTITION_MONTHS_AHEAD months (the periodic job `audit.partitions`,
  daily, and `manage.py audit_partitions`). A month whose events already sit in
  the DEFAULT partition is not created (PostgreSQL would refuse it); it is
  reported, and those events stay where they are, verified and archived as any.
- `empty_archived` truncates each past month partition all of whose events an
  archive covers (tools_app/retention/audit_archive.py writes the files and the
  AuditArchive rows first): one statement instead of deleting its rows one by
  one, and no table bloat left for vacuum. It locks that partition alone, not the
  table nor the tenants its rows refer to (detaching and dropping it would lock
  both), for as long as two index reads and the TRUNCATE take, and gives up after
  a short lock timeout when a reader is inside it: the next purge tries again.
  The emptied month's table stays, empty (a few pages); dropping old months'
  tables is a maintenance-window task (docs/audit-log.md).

The hash chain is indifferent to where rows are stored: it runs in `seq` order
across partitions, and what an emptied partition held is in archive files whose
first and last hashes chain into the kept events (docs/audit-log.md).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from datetime import UTC, datetime

from django.db import OperationalError, connection, transaction

from tools_app.conf import conf
from tools_app.core import audit, clock
from tools_app.core.models import AuditArchive

logger = logging.getLogger(__name__)

TABLE = "tools_app_auditevent"
ARCHIVER = "system:retention"
DEFAULT = f"{TABLE}_default"
_MONTH_NAME = re.compile(rf"^{TABLE}_y(\d{{4}})m(\d{{2}})$")
# How long creating or emptying a partition waits for its locks before leaving it to the next run.
LOCK_TIMEOUT = "2s"


@dataclass(frozen=True)
class Partition:
    name: str
    start: datetime | None  # None: the DEFAULT partition
    end: datetime | None


@dataclass(frozen=True)
class Ensured:
    created: list[str]
    blocked: list[str]  # months whose events are already in the DEFAULT partition
    busy: list[str]  # not created now: a long reader held the table past the lock timeout


def month_start(moment: datetime) -> datetime:
    moment = moment.astimezone(UTC)
    return datetime(moment.year, moment.month, 1, tzinfo=UTC)


def next_month(start: datetime) -> datetime:
    return datetime(start.year + start.month // 12, start.month % 12 + 1, 1, tzinfo=UTC)


def month_name(start: datetime) -> str:
    return f"{TABLE}_y{start.year:04d}m{start.month:02d}"


def partitions() -> list[Partition]:
    """The audit table's partitions, months in order, then the DEFAULT one."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = %s::regclass", [TABLE])
        names = [row[0] for row in cursor.fetchall()]
    months = []
    for name in names:
        if match := _MONTH_NAME.match(name):
            start = datetime(int(match[1]), int(match[2]), 1, tzinfo=UTC)
            months.append(Partition(name, start, next_month(start)))
    months.sort(key=lambda partition: partition.start or datetime.min.replace(tzinfo=UTC))
    return months + [Partition(name, None, None) for name in names if name == DEFAULT]


def counts() -> list[tuple[Partition, int]]:
    """Each partition with its number of events (counted: a partition is a month's events)."""
    result = []
    with connection.cursor() as cursor:
        for partition in partitions():
            cursor.execute(f"SELECT count(*) FROM {partition.name}")
            result.append((partition, cursor.fetchone()[0]))
    return result


def ensure(*, months_ahead: int | None = None, since: datetime | None = None) -> Ensured:
    """Create the month partitions from `since`'s month (default: this month) to `months_ahead` months after
    this one; returns the ones created and the ones the DEFAULT partition's events stand in the way of."""
    ahead = conf().audit_partition_months_ahead if months_ahead is None else months_ahead
    now = month_start(clock.read())
    start = month_start(since) if since is not None else now
    last = now
    for _ in range(ahead):
        last = next_month(last)
    existing = {partition.name for partition in partitions()}
    created: list[str] = []
    blocked: list[str] = []
    busy: list[str] = []
    while start <= last:
        name = month_name(start)
        if name not in existing:
            try:
                (created if _create(name, start, next_month(start)) else blocked).append(name)
            except OperationalError as exc:  # the lock timeout; the months ahead leave time for the next run
                logger.warning("audit partition %s not created now (%s); the next run tries again", name, exc)
                busy.append(name)
        start = next_month(start)
    if created:
        logger.info("audit partitions created: %s", ", ".join(created))
    if blocked:
        logger.error("audit partitions not created, their months' events are in %s: %s (docs/audit-log.md)",
                     DEFAULT, ", ".join(blocked))
    return Ensured(created, blocked, busy)


def _create(name: str, start: datetime, end: datetime) -> bool:
    with transaction.atomic(), connection.cursor() as cursor:
        # Creating a partition locks the parent against writers: rather than queue them behind a long
        # reader, give up after a short wait. Taken first, so that no event lands in DEFAULT between
        # the check below and the creation.
        cursor.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
        cursor.execute(f"LOCK TABLE ONLY {TABLE} IN ACCESS EXCLUSIVE MODE")
        cursor.execute(f"SELECT EXISTS (SELECT 1 FROM {DEFAULT} WHERE created_at >= %s AND created_at < %s)",
                       [start, end])
        if cursor.fetchone()[0]:
            return False
        # DDL takes no parameters: the bounds are our own datetimes' ISO forms.
        cursor.execute(f"CREATE TABLE IF NOT EXISTS {name} PARTITION OF {TABLE} "
                       f"FOR VALUES FROM ('{start.isoformat()}') TO ('{end.isoformat()}')")
    return True


@dataclass(frozen=True)
class Emptied:
    emptied: list[str]
    busy: list[str]  # all archived, but a reader held the partition: left to the next purge


def empty_archived(archive: AuditArchive) -> Emptied:
    """Truncate every month partition that ended before now and holds events, all of which `archive` (the
    newest) or an earlier one covers. Each is audited, about that archive."""
    now = clock.read()
    emptied, busy = [], []
    for partition in partitions():
        if partition.end is None or partition.end > now:
            continue
        try:
            outcome = _empty_if_archived(partition, archive)
        except OperationalError as exc:  # the lock timeout: a long reader holds the partition
            logger.warning("audit partition %s not emptied now (%s); the next purge tries again",
                           partition.name, exc)
            outcome = "busy"
        if outcome == "emptied":
            emptied.append(partition.name)
        elif outcome == "busy":
            busy.append(partition.name)
    return Emptied(emptied, busy)


def _empty_if_archived(partition: Partition, archive: AuditArchive) -> str:
    with transaction.atomic(), connection.cursor() as cursor:
        # As the archiver: no verification page may be reading these rows.
        cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [audit.ARCHIVE_LOCK_KEY])
        if not cursor.fetchone()[0]:
            return "busy"
        # A month that holds an event past the archive (every month retention keeps, at each purge) is
        # told by its newest seq, which its seq index answers at once: it is not counted.
        cursor.execute(f"SELECT max(seq) FROM {partition.name}")
        (newest,) = cursor.fetchone()
        if newest is None or newest > archive.last_seq:
            return "kept"
        # Counted before any strong lock: a reader is not held while a month is counted.
        cursor.execute(f"SELECT count(*), min(seq), max(seq) FROM {partition.name}")
        events, first_seq, last_seq = cursor.fetchone()
        if not events or last_seq is None or last_seq > archive.last_seq:
            return "kept"
        # The partition alone (not the table, not the tenants its rows refer to): from here no event can
        # arrive in it and no reader is in it. Then what the indexes answer at once: nothing unsealed,
        # nothing past the archive (an event that arrived since the count would be one or the other).
        cursor.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
        cursor.execute(f"LOCK TABLE {partition.name} IN ACCESS EXCLUSIVE MODE")
        cursor.execute(f"SELECT EXISTS (SELECT 1 FROM {partition.name} WHERE seq IS NULL), "
                       f"(SELECT max(seq) FROM {partition.name})")
        unsealed, newest = cursor.fetchone()
        if unsealed or newest != last_seq:
            return "kept"
        cursor.execute(f"TRUNCATE {partition.name}")
        audit.record_event(action="audit.partition_truncated", obj=archive, actor=ARCHIVER, after={
            "partition": partition.name, "from": partition.start.isoformat() if partition.start else None,
            "to": partition.end.isoformat() if partition.end else None, "events": events,
            "first_seq": first_seq, "last_seq": last_seq, "archived_up_to_seq": archive.last_seq})
    return "emptied"
