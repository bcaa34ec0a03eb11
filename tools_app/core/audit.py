"""The audit log: append-only events written in the transaction of the change.

`record_event` is called by every state-changing function (the engine,
approvals, reconciliation, operator actions) inside its transaction, so an
event exists if and only if the change committed.

The hash chain. Writers only INSERT (seq, prev_hash and hash empty): they
never wait for each other. The sealer (`seal`, a periodic job and a command)
takes one advisory lock, reads the committed events not yet sealed in id
order, and gives each the next `seq`, the previous event's hash and its own
hash = SHA-256(prev_hash + canonical content). A transaction that commits
late simply lands in a later seal: the chain's order is seal order, and
every committed event is in it. Each sealing run also appends an AuditSeal
(the head after it), so deleting the newest events is noticed as well.

A trigger (migration 0002) refuses DELETE (except of what an AuditArchive
covers) and any UPDATE other than sealing an unsealed row once; `verify_chain` finds what someone who got past it
(table owner, disabled trigger, restored backup) changed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC
from typing import TYPE_CHECKING, Any

from django.db import connection, models, transaction
from django.utils import timezone

from tools_app.core import instances, logs
from tools_app.core.models import AuditArchive, AuditCheckpoint, AuditEvent, AuditSeal
from tools_app.core.redaction import PERSON_PREFIX

if TYPE_CHECKING:
    from django.contrib.auth.base_user import AbstractBaseUser
    from django.contrib.auth.models import AnonymousUser

SYSTEM = "system"
GENESIS_HASH = "0" * 64
# pg_advisory_xact_lock key of the sealer: any fixed 64-bit number unique in this database.
SEAL_LOCK_KEY = 0x1DE0_A0D1_7C4A_1200
SEAL_BATCH = 1000
# Taken shared by each page of verification and exclusive by the archiver (tools_app.retention.audit_archive),
# so a page never sees the rows it is reading deleted under it.
ARCHIVE_LOCK_KEY = 0x1DE0_A0D1_7C4A_1300


def user_actor(user: AbstractBaseUser | AnonymousUser) -> str:
    """How a person appears in audit events and on decisions."""
    return f"user:{user.get_username()}"


def record_event(**fields: Any) -> AuditEvent:
    """Write an event now (call inside the transaction of the change)."""
    event = new_event(**fields)
    event.save()
    announce(event)
    return event


def announce(event: AuditEvent) -> None:
    """A person's action (a decision, an operator's action, a refusal) is also one log line, once it
    commits. The reason is not logged: it is free text a person wrote (the audit log keeps it)."""
    if not event.actor.startswith(PERSON_PREFIX):
        return
    fields = {"action": event.action, "actor": event.actor, "tenant_id": event.tenant_id,
              "object_type": event.object_type, "object_id": event.object_id,
              "object_trace_id": event.trace_id or None}
    transaction.on_commit(lambda: logs.get("tools_app.operators").info("operator.action", **fields))


def new_event(
    *,
    action: str,
    obj: models.Model | type[models.Model],
    actor: str,
    tenant_id: int | None = None,
    before: dict[str, Any] | None = None,
    after: dict[str, Any] | None = None,
    reason: str = "",
    trace_id: str = "",
) -> AuditEvent:
    """An unsaved event about `obj`: for statements that insert it together with the change.

    `obj` may be a model class for an event about no single row of it (an attempt on "all
    of them", refused): its object id is then `*`.
    """
    about_a_row = not isinstance(obj, type)
    # A queue's proxy (UNKNOWN outcome, dead letter) is the row itself: name the real model.
    concrete = obj._meta.concrete_model
    assert concrete is not None and concrete._meta.model_name is not None, "only installed models are audited"
    return instances.unsaved(
        AuditEvent,
        tenant_id=tenant_id if tenant_id is not None else (getattr(obj, "tenant_id", None) if about_a_row else None),
        actor=actor,
        action=action,
        object_type=concrete._meta.model_name,
        object_id=str(obj.pk) if about_a_row else "*",
        before=before,
        after=after,
        reason=reason,
        trace_id=trace_id,
        # Records, tasks, approval requests and outbox events carry the operation they belong to.
        operation_id=getattr(obj, "operation_id", None) if about_a_row else None,
        created_at=timezone.now(),
    )


# --- the chain -----------------------------------------------------------------


def event_hash(prev_hash: str, event: AuditEvent) -> str:
    """The hash of an event as read from the database, linked to its predecessor."""
    return content_hash(prev_hash, event_content(event))


def event_content(event: AuditEvent) -> dict[str, Any]:
    """What an event's hash covers (an archive file holds exactly this, with the hashes)."""
    content = {
        "seq": event.seq, "id": event.pk, "tenant_id": event.tenant_id, "actor": event.actor,
        "action": event.action, "object_type": event.object_type, "object_id": event.object_id,
        "before": event.before, "after": event.after, "reason": event.reason, "trace_id": event.trace_id,
        "created_at": event.created_at.astimezone(UTC).isoformat(),
    }
    if event.operation_id is not None:
        # Only when set: events sealed before the column existed keep their hashes.
        content["operation_id"] = str(event.operation_id)
    return content


def content_hash(prev_hash: str, content: dict[str, Any]) -> str:
    body = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(f"{prev_hash}\n{body}".encode()).hexdigest()


@dataclass(frozen=True)
class SealResult:
    sealed: int
    head_seq: int
    head_hash: str


def seal(*, wait: bool = True) -> SealResult:
    """Link every committed, unsealed event into the chain; returns how many and the new head.

    With wait=False a sealer already running is left to finish the job (the
    periodic job does this, so two workers never queue behind each other).
    """
    sealed = 0
    while True:
        batch = _seal_batch(wait=wait)
        if batch is None:
            break
        sealed += batch
    head = chain_head()
    return SealResult(sealed=sealed, head_seq=head[0], head_hash=head[1])


def _seal_batch(*, wait: bool) -> int | None:
    """Seal up to SEAL_BATCH events in one transaction. None: nothing to do (or another sealer holds the lock)."""
    with transaction.atomic():
        if not _take_seal_lock(wait):
            return None
        seq, prev_hash = chain_head()
        events = list(AuditEvent.objects.filter(seq__isnull=True).order_by("id")[:SEAL_BATCH])
        if not events:
            return None
        first_seq = seq + 1
        for event in events:
            seq += 1
            event.seq, event.prev_hash = seq, prev_hash
            event.hash = prev_hash = event_hash(prev_hash, event)
        _link(events)
        AuditSeal.objects.create(first_seq=first_seq, last_seq=seq, last_hash=prev_hash, events=len(events),
                                 sealed_at=timezone.now())
        return len(events)


def _link(events: list[AuditEvent]) -> None:
    """Write the batch's chain fields in one UPDATE (the trigger allows exactly this, once per event)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {AuditEvent._meta.db_table} AS e SET seq = v.seq, prev_hash = v.prev_hash, hash = v.hash "
            "FROM unnest(%s::bigint[], %s::bigint[], %s::text[], %s::text[]) AS v(id, seq, prev_hash, hash) "
            "WHERE e.id = v.id AND e.seq IS NULL",
            [[e.pk for e in events], [e.seq for e in events], [e.prev_hash for e in events],
             [e.hash for e in events]])
        if cursor.rowcount != len(events):  # cannot happen under the lock; never seal a partial batch
            raise RuntimeError(f"sealed {cursor.rowcount} of {len(events)} events; batch rolled back")


def _take_seal_lock(wait: bool) -> bool:
    with connection.cursor() as cursor:
        if wait:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [SEAL_LOCK_KEY])
            return True
        cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [SEAL_LOCK_KEY])
        locked: bool = cursor.fetchone()[0]
        return locked


def chain_head() -> tuple[int, str]:
    """(seq, hash) of the newest seal; (0, GENESIS_HASH) before the first."""
    head = AuditSeal.objects.order_by("-last_seq").values_list("last_seq", "last_hash").first()
    return head or (0, GENESIS_HASH)


# --- verification ----------------------------------------------------------------


@dataclass(frozen=True)
class BrokenLink:
    seq: int
    event_id: int | None
    problem: str

    def __str__(self) -> str:
        event = f" (event id {self.event_id})" if self.event_id is not None else ""
        return f"seq {self.seq}{event}: {self.problem}"


@dataclass(frozen=True)
class ChainReport:
    verified: int
    head_seq: int
    head_hash: str
    unsealed: int
    broken: BrokenLink | None
    # Where to continue when a limit stopped the check before the end of the range (None: done, or broken).
    next_seq: int | None = None

    @property
    def ok(self) -> bool:
        return self.broken is None


def verify_chain(from_seq: int = 1, to_seq: int | None = None, *, start_hash: str | None = None,
                 limit: int | None = None) -> ChainReport:
    """Recompute the chain over [from_seq, to_seq] (default: all of it); report the first broken link.

    Detects an edited event (its hash no longer matches its content), an
    edited link (prev_hash differs from the predecessor's hash), deleted
    events (a gap in seq, or a chain shorter than the newest seal) and a
    rewritten chain that no longer matches the seals written at the time.
    The chain starts at the archived head (its last hash: what came before
    is in archive files, tools_app.retention.audit_archive). A range
    starting after it trusts `start_hash` as the hash of the event just
    before it (a checkpoint's, a previous page's) or, without one, that
    event's hash as stored. With `limit`, at most that many events are
    checked and `next_seq` says where to continue (with this head_hash).
    """
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock_shared(%s)", [ARCHIVE_LOCK_KEY])
        return _verify_page(from_seq, to_seq, start_hash, limit)


def _verify_page(from_seq: int, to_seq: int | None, start_hash: str | None, limit: int | None) -> ChainReport:
    archived_seq, archived_hash = archived_head()
    expected_seq = max(from_seq, archived_seq + 1)
    if from_seq <= archived_seq or (expected_seq == archived_seq + 1 and start_hash is None):
        # What was archived is verified from its file; the kept chain starts at the archived head.
        prev_hash: str | None = archived_hash
    else:
        prev_hash = start_hash or _hash_before(expected_seq)
    end = min(chain_head()[0], to_seq or sys.maxsize)
    page_end = end if limit is None else min(end, expected_seq + limit - 1)
    # Only the seals inside this page: the seal table grows by one row a minute, for years.
    seals = dict(AuditSeal.objects.filter(last_seq__gte=expected_seq, last_seq__lte=page_end)
                 .values_list("last_seq", "last_hash"))
    verified, broken = 0, None
    events = AuditEvent.objects.filter(seq__gte=expected_seq, seq__lte=page_end).order_by("seq")
    if prev_hash is None:
        broken = BrokenLink(expected_seq - 1, None, f"event {expected_seq - 1}, the start of the range, is missing")
    else:
        for event in events.iterator(chunk_size=2000):
            broken = _check_link(event, expected_seq, prev_hash, seals)
            if broken is not None:
                break
            # _check_link found the event at expected_seq
            expected_seq, prev_hash, verified = expected_seq + 1, event.hash, verified + 1
    if broken is None and expected_seq <= page_end:
        broken = BrokenLink(expected_seq, None, f"events {expected_seq}..{page_end} are missing: the chain ends "
                                                f"at {expected_seq - 1} but a seal covers up to {page_end}")
    return ChainReport(verified=verified, head_seq=expected_seq - 1, head_hash=prev_hash or "",
                       unsealed=AuditEvent.objects.filter(seq__isnull=True).count(), broken=broken,
                       next_seq=page_end + 1 if broken is None and page_end < end else None)


def verify_incrementally(*, every: int, from_seq: int | None = None, to_seq: int | None = None, full: bool = False,
                         progress: Callable[[ChainReport, bool], None] | None = None) -> ChainReport:
    """Verify in ranges of `every` events, storing an AuditCheckpoint after each sound range.

    Starts after the newest checkpoint, trusting its hash (each range is committed on its
    own: a verification killed halfway resumes there); `full` starts again from seq 1,
    recomputing what earlier checkpoints covered; `from_seq` starts there. Checkpoints are
    written only for a walk anchored at the genesis or at a checkpoint, so they always
    cover one unbroken prefix of the chain. `progress(range report, checkpointed)` is
    called after each range. The result counts every event verified by this call.
    """
    seq, start_hash, anchored = _start_of_verification(from_seq, full)
    verified = 0
    while True:
        report = verify_chain(seq, to_seq, start_hash=start_hash, limit=every)
        verified += report.verified
        checkpointed = anchored and report.ok and report.verified > 0
        if checkpointed:
            AuditCheckpoint.objects.create(first_seq=seq, last_seq=report.head_seq, last_hash=report.head_hash,
                                           events=report.verified, verified_at=timezone.now())
        if progress is not None:
            progress(report, checkpointed)
        if report.next_seq is None:
            return dataclasses.replace(report, verified=verified)
        seq, start_hash = report.next_seq, report.head_hash


def _start_of_verification(from_seq: int | None, full: bool) -> tuple[int, str | None, bool]:
    """(first seq, hash trusted before it, whether its ranges may be checkpointed)."""
    archived_seq, archived_hash = archived_head()
    if full or (from_seq is not None and from_seq <= archived_seq + 1):
        return archived_seq + 1, archived_hash, True
    checkpoints = AuditCheckpoint.objects.order_by("-last_seq", "-id")
    if from_seq is not None:
        checkpoint = checkpoints.filter(last_seq=from_seq - 1).first()
        return (from_seq, checkpoint.last_hash, True) if checkpoint else (from_seq, None, False)
    newest = checkpoints.filter(last_seq__gt=archived_seq).first()
    return (newest.last_seq + 1, newest.last_hash, True) if newest else (archived_seq + 1, archived_hash, True)


def archived_head() -> tuple[int, str]:
    """(seq, hash) of the newest archived event; (0, GENESIS_HASH) when nothing was archived."""
    head = AuditArchive.objects.order_by("-last_seq").values_list("last_seq", "last_hash").first()
    return head or (0, GENESIS_HASH)


def _hash_before(seq: int) -> str | None:
    return AuditEvent.objects.filter(seq=seq - 1).values_list("hash", flat=True).first()


def _check_link(event: AuditEvent, expected_seq: int, prev_hash: str, seals: dict[int, str]) -> BrokenLink | None:
    assert event.seq is not None, "verify_chain reads sealed events only (seq >= 1)"
    if event.seq != expected_seq:
        return BrokenLink(expected_seq, None, f"events {expected_seq}..{event.seq - 1} are missing (deleted)")
    if event.prev_hash != prev_hash:
        return BrokenLink(event.seq, event.pk, "its link to the previous event was changed, or that event was")
    if event.hash != event_hash(prev_hash, event):
        return BrokenLink(event.seq, event.pk, "its content was edited after sealing")
    if event.seq in seals and seals[event.seq] != event.hash:
        return BrokenLink(event.seq, event.pk, "the chain was rewritten: it no longer matches the seal of that time")
    return None
