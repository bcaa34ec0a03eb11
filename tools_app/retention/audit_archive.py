"""Audit events past their tenants' retention leave the table for a file, as a prefix of the chain.

The chain is one sequence over every tenant, so removing an event from its
middle would break it for everyone. The purge job therefore archives only a
prefix: the events from the archived head on, up to the first one still within
its tenant's retention (AuditRetention, else IDEMOPS_AUDIT_RETENTION_DAYS; 0
keeps for ever). In one transaction it verifies that range (a tampered chain is
never archived, which would launder it), writes it to a JSON-lines file (a
header with the range and its first and last chain hashes, then each event's
hashed content with its prev_hash and hash) and records an AuditArchive. Then
`remove_archived` takes what the archives cover out of the table: a past month's
partition holding nothing else is truncated, other covered events are
deleted (the database trigger allows deleting exactly what an archive covers).
Verification of what is kept then starts from the archived head's hash, and
`verify_archive_file` checks a file on its own.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from datetime import datetime, timedelta
from itertools import takewhile
from pathlib import Path
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from tools_app.conf import conf
from tools_app.core import audit, audit_partitions, clock
from tools_app.core.models import AuditArchive, AuditEvent
from tools_app.retention.models import AuditRetention

ARCHIVER = "system:retention"
# Events one archive (and one transaction) takes at most.
ARCHIVE_BATCH = 10_000
HEADER = "idemops audit archive"


class ArchiveRefused(RuntimeError):
    """The range to archive does not verify: it stays in the table, for verify_audit_log to report."""


def archive_expired(*, now: datetime | None = None, batch: int = ARCHIVE_BATCH) -> int:
    """Archive every expired prefix of the chain, `batch` events per file; returns how many events."""
    now = now or clock.read()  # the database's time, as the purge's
    total = 0
    try:
        while archived := _archive_batch(now, batch):
            total += archived
    finally:  # also what earlier batches archived when a later one is refused
        remove_archived(batch=batch)
    return total


def remove_archived(*, batch: int = ARCHIVE_BATCH) -> int:
    """Take out of the table what the archives cover: each past month partition holding nothing else is
    truncated (audit_partitions.empty_archived); the covered events left elsewhere (a month partly
    kept, the DEFAULT partition) are deleted, `batch` per transaction. Returns the events deleted.

    Apart from the archiving, so that a month's events leave by one TRUNCATE rather than row by row; an
    archiver that dies in between leaves covered events in the table, which verification (starting at
    the archived head) ignores and the next purge removes.
    """
    newest = AuditArchive.objects.order_by("-last_seq").first()
    if newest is None:
        return 0
    partitions = audit_partitions.empty_archived(newest)
    deleted = 0
    for partition in audit_partitions.partitions():
        if partition.name not in partitions.busy:  # those leave whole, at the next purge
            deleted += _delete_covered(partition.name, newest.last_seq, batch)
    return deleted


def _delete_covered(table: str, last_seq: int, batch: int) -> int:
    deleted = 0
    while True:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [audit.ARCHIVE_LOCK_KEY])
            if not cursor.fetchone()[0]:
                return deleted  # a verification page is reading: the next purge
            cursor.execute(f"DELETE FROM {table} WHERE id IN (SELECT id FROM {table} WHERE seq <= %s LIMIT %s)",
                           [last_seq, batch])
            deleted += int(cursor.rowcount)
            if cursor.rowcount < batch:
                return deleted


def _archive_batch(now: datetime, batch: int) -> int:
    with transaction.atomic():
        with connection.cursor() as cursor:
            # Exclusive: one archiver at a time, and no verification page reading the rows it deletes.
            cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [audit.ARCHIVE_LOCK_KEY])
            if not cursor.fetchone()[0]:
                return 0  # the next purge archives it
        head_seq, head_hash = audit.archived_head()
        window = AuditEvent.objects.filter(seq__gt=head_seq, seq__lte=min(audit.chain_head()[0], head_seq + batch))
        policies = dict(AuditRetention.objects.values_list("tenant_id", "keep_days"))
        default = conf().audit_retention_days
        expired = list(takewhile(lambda event: _expired(event, policies, default, now), window.order_by("seq")))
        if not expired:
            return 0
        last = expired[-1]
        assert last.seq is not None
        report = audit.verify_chain(head_seq + 1, last.seq)
        if not report.ok:
            raise ArchiveRefused(f"not archived: the chain is broken at {report.broken}")
        path, digest = _write(expired, head_seq, head_hash)
        archive = AuditArchive.objects.create(
            first_seq=head_seq + 1, last_seq=last.seq, first_prev_hash=head_hash, last_hash=last.hash,
            events=len(expired), path=str(path), sha256=digest, archived_at=timezone.now())
        audit.record_event(action="audit.archived", obj=archive, actor=ARCHIVER,
                           after={"first_seq": archive.first_seq, "last_seq": archive.last_seq,
                                  "last_hash": archive.last_hash, "file": path.name, "sha256": digest})
        return len(expired)


def _expired(event: AuditEvent, policies: dict[int, int], default: int, now: datetime) -> bool:
    days = policies.get(event.tenant_id, default) if event.tenant_id is not None else default
    return days > 0 and event.created_at <= now - timedelta(days=days)


def _write(events: list[AuditEvent], head_seq: int, head_hash: str) -> tuple[Path, str]:
    """Write the file (durably: fsynced before the rows go) and return its path and SHA-256."""
    directory = conf().audit_archive_dir
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"audit-{head_seq + 1:012d}-{events[-1].seq:012d}.jsonl"
    header = {"archive": HEADER, "first_seq": head_seq + 1, "last_seq": events[-1].seq,
              "first_prev_hash": head_hash, "last_hash": events[-1].hash, "events": len(events)}
    lines = [header] + [{**audit.event_content(e), "prev_hash": e.prev_hash, "hash": e.hash} for e in events]
    data = "".join(json.dumps(line, ensure_ascii=False, default=str) + "\n" for line in lines).encode()
    partial = path.with_suffix(".partial")
    with open(partial, "wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())
    partial.replace(path)
    return path, hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class ArchiveCheck:
    events: int
    first_prev_hash: str
    last_hash: str
    problem: str | None


def verify_archive_file(path: Path) -> ArchiveCheck:
    """Recompute an archive file's chain from its header's first_prev_hash to its last_hash."""
    with open(path, encoding="utf-8") as file:
        header: dict[str, Any] = json.loads(file.readline())
        prev_hash, expected_seq, problem, count = header["first_prev_hash"], header["first_seq"], None, 0
        for line in file:
            event = json.loads(line)
            stored_prev, stored = event.pop("prev_hash"), event.pop("hash")
            if event["seq"] != expected_seq:
                problem = f"seq {expected_seq} is missing"
            elif stored_prev != prev_hash or audit.content_hash(prev_hash, event) != stored:
                problem = f"seq {expected_seq} does not verify"
            if problem:
                break
            prev_hash, expected_seq, count = stored, expected_seq + 1, count + 1
    if problem is None and (prev_hash != header["last_hash"] or count != header["events"]):
        problem = "the file ends before its header's last hash"
    return ArchiveCheck(events=count, first_prev_hash=header["first_prev_hash"], last_hash=prev_hash,
                        problem=problem)
