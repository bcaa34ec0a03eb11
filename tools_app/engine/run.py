"""Running an operation once: claim it, execute it as its one executor, or follow whoever did.

1. Claim (claims.claim): the caller whose row went in is the executor; every other caller
   is a follower.
2. Execute: the executor runs the side effect and marks the record SUCCEEDED in the same
   transaction (local effects), or FAILED with an error class, or UNKNOWN when a downstream
   system may or may not have acted.
3. Follow: a follower with the same fingerprint replays the stored result, waits a bounded time
   for an executor still working (taking over a lease that ran out), or is told what to do
   (`in_progress`, `unknown_outcome`, `transient` + retry_after); other arguments get
   `conflict` naming the differing fields. A record waiting for something the engine does not
   know (a person's approval) is answered by the hook its owner registered (engine.hooks).

A follower's wait is a value, not a sleep: `start` answers the outcome or a handle on the wait
(core.polling.Pending) that goes on from where it waited, never from the top; `run` waits in
its thread, an MCP call on the event loop without holding a database thread.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import TypeVar

from django.db import DataError, connection, transaction

from tools_app.conf import conf
from tools_app.core import db, polling
from tools_app.core.crashpoints import crash_point
from tools_app.core.errors import (
    INFRASTRUCTURE_ERRORS,
    UNKNOWN_OUTCOME_ADVICE,
    Conflict,
    Expired,
    InProgress,
    InternalError,
    ToolFailure,
    Transient,
    UnknownOutcome,
    internal_error,
    invalid_data,
)
from tools_app.core.keys import key_digest
from tools_app.engine.claims import claim, find_live, reclaim, uncommitted, whole
from tools_app.engine.hooks import hooks
from tools_app.engine.models import IdempotencyRecord, RecordStatus
from tools_app.engine.operation import (
    ClaimWaitExpired,
    Executor,
    ExpiryPolicy,
    LeaseLost,
    Operation,
    Outcome,
    evidence_entry,
    gathering_evidence,
)
from tools_app.engine.transitions import (
    backed_off,
    close_retry_window,
    escalate_retries,
    expire_lease,
    heartbeat,
    is_expired,
    lease_expired,
    mark_failed,
    mark_succeeded,
    mark_unknown,
    reread,
    retire,
    retry_wait,
    retry_window_closed,
    start_approved,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")

def run(op: Operation, execute: Executor) -> Outcome:
    """Execute `op` once, or answer as a follower of whoever did, waiting in this thread where a
    follower waits (a job, a test, an in-process caller; an MCP call waits on the event loop: `start`)."""
    return polling.settle(start(op, execute))


def start(op: Operation, execute: Executor) -> Outcome | polling.Pending[Outcome]:
    """Execute `op` once, or answer as a follower of whoever did: the outcome, or a handle on the
    wait for the executor still working (polling.Pending), which goes on from that wait."""
    return _attempt(op, execute, rounds=3)


def _attempt(op: Operation, execute: Executor, rounds: int) -> Outcome | polling.Pending[Outcome]:
    """Claim or follow. A retired key or a lost reclaim race sends us round again (`rounds` times
    at the most: each round means another caller made progress)."""
    for left in range(rounds - 1, -1, -1):
        first = _claim_or_live(op, execute)
        if isinstance(first, Outcome):
            return first
        answer = _follow(first, op, execute)
        if isinstance(answer, polling.Pending):
            return answer.map(functools.partial(_after_follow, op, execute, left))
        if answer is not None:
            return answer
    return _changing_hands(op)


def _claim_or_live(op: Operation, execute: Executor) -> Outcome | IdempotencyRecord:
    """This call's outcome as the key's executor (or why it may not run now), or the live record to
    follow.

    The claim's one statement also reads what a replay needs of a live record, so a local tool's call
    that claims first costs a first call one statement and a replay that statement with its
    transaction's BEGIN and COMMIT; reading first costs a replay one indexed read and a first call one
    read more. So a local tool's call reads first where its tool's recent calls mostly found their key
    live (`_LiveShare`), or where it holds its entity before it claims (op.hold: a replay is answered
    even while its entity is busy). A downstream tool's call always reads first: it is admitted
    (op.admit: a pause, a circuit breaker whose one probe it may take) before its claim commits, and
    only a call that runs may be admitted. A local tool's call is admitted once it has won its claim,
    in the claim's transaction: held back, it rolls its claim back and leaves nothing.
    """
    answered_before_claim = not op.transactional or op.hold is not None
    if answered_before_claim or _live_share.mostly_live(op.tool):
        # Otherwise a miss goes straight on to the claim, which also finds a purged key's record.
        record = find_live(op, purged=answered_before_claim)
        _live_share.saw(op.tool, live=record is not None)
        if record is not None:
            return record
    try:
        with _holding(op) as busy:
            if busy is not None:
                return Outcome(uncommitted(op), error=busy)
            outcome, record = _claim_and_execute(op, execute)
    except ClaimWaitExpired:
        # Another call's claim is still uncommitted: answer its operation id all the same.
        return Outcome(uncommitted(op), error=_in_progress())
    except _HeldBack as back:
        return Outcome(uncommitted(op), error=back.reason)
    _live_share.saw(op.tool, live=outcome is None)
    return record if outcome is None else outcome


class _LiveShare:
    """Per tool, in this process, the share of recent calls that found their key live (a moving
    average over about the last `CALLS` calls): which is cheaper to do first, read or claim. Only an
    order of statements hangs on it, never an answer; an update lost to a race costs nothing."""

    CALLS = 20

    def __init__(self) -> None:
        self._share: dict[str, float] = {}

    def mostly_live(self, tool: str) -> bool:
        return self._share.get(tool, 0.0) > 0.5

    def saw(self, tool: str, *, live: bool) -> None:
        share = self._share.get(tool, 0.0)
        self._share[tool] = share + (float(live) - share) / self.CALLS


_live_share = _LiveShare()


def _after_follow(op: Operation, execute: Executor, rounds: int, answer: Outcome | None
                  ) -> Outcome | polling.Pending[Outcome]:
    """A follower's answer after its wait; None (claim again) takes one of the `rounds` left."""
    if answer is not None:
        return answer
    return _attempt(op, execute, rounds) if rounds else _changing_hands(op)


def _changing_hands(op: Operation) -> Outcome:
    # Named like any in_progress answer: the key's live record, or the claim of it not yet committed.
    return Outcome(find_live(op) or uncommitted(op), error=_in_progress("the operation is changing hands; ask again"))


def _claim_and_execute(op: Operation, execute: Executor) -> tuple[Outcome | None, IdempotencyRecord]:
    """Claim the key and, if this call won it, execute: (its outcome, record), or (None, the
    record to follow).

    A local effect is claimed inside its own transaction: the record, the effect
    and the outcome commit together, in one commit, and a crash leaves nothing
    (the next call simply runs it). A downstream effect is claimed by a commit of
    its own first, so a crash mid-call leaves a PROCESSING record whose lease runs
    out and whose outcome is reconciled.
    """
    if not op.transactional:
        _admit(op)
        record, claimed = claim(op)
        if not claimed:
            return None, record
        outcome = _execute(record, op, execute)
    else:
        try:
            with transaction.atomic():
                record, claimed = claim(op)
                if not claimed:
                    return None, record
                _admit(op)  # held back: the claim rolls back with this transaction
                outcome = _execute_with_claim(record, op, execute)
        except _EffectFailed as failed:
            if failed.session_lost:
                # The database session itself died: nothing was committed and nothing can be recorded
                # on it; the next call runs the operation, as after a crash.
                raise failed.error from None
            # The effect failed and its transaction rolled back, claim included. The failure is
            # recorded under a claim of its own; if another call has claimed the key since, that
            # call's record is the one to follow.
            with transaction.atomic():
                record, claimed = claim(op)
                if not claimed:
                    return None, record
                outcome = _failed(record, op, failed.error)
    crash_point("after_commit")
    return outcome, record


class _EffectFailed(Exception):
    """A local effect raised inside the claim's transaction: `error`, recorded once that transaction
    has rolled back."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error
        # psycopg marks its connection broken as soon as it finds the session gone
        self.session_lost: bool = getattr(connection.connection, "broken", True)


def _execute_with_claim(record: IdempotencyRecord, op: Operation, execute: Executor) -> Outcome:
    """Run a local effect in the open transaction that holds its claim, and record it there.

    No savepoint: on success the claim, the effect and the outcome commit as one; on failure the
    whole transaction rolls back (_EffectFailed) and the failure is recorded afresh.
    """
    try:
        return _effect(record, op, execute, in_claim=True)
    except Exception as exc:
        raise _EffectFailed(exc) from exc


def _follow(record: IdempotencyRecord, op: Operation, execute: Executor
            ) -> Outcome | None | polling.Pending[Outcome | None]:
    """Answer a caller that lost the claim, or wait for the executor and then answer. None means: try
    to claim again."""
    if record.status == RecordStatus.SUCCEEDED and op.matches(record) and not is_expired(record):
        return Outcome(record, replayed=True)  # a replay: the claim (or find_live) read all it needs
    record = whole(record)
    if is_expired(record):
        if op.on_expiry == ExpiryPolicy.HOLD:
            return Outcome(record, error=Expired(
                f"this key's retention ended at {record.expires_at.isoformat()}; "
                "a person must check before it is used again"))
        retire(record, actor=op.actor)
        return None
    if not op.matches(record):
        fields = op.differing_fields(record)
        return Outcome(record, error=Conflict(
            f"idempotency_key was already used with other arguments (differing: {', '.join(fields)}); "
            "use a new key for a new operation",
            differing_fields=fields))
    if record.status == RecordStatus.PROCESSING:
        return wait_for_outcome(record, lambda: _after_wait(record, op, execute))
    return _follow_status(record, op, execute)


def _after_wait(record: IdempotencyRecord, op: Operation, execute: Executor) -> Outcome | None:
    """Where a follower goes on once its wait for the executor ended (the record as it last read it)."""
    if record.status == RecordStatus.PROCESSING and lease_expired(record):
        record = _take_over(record, op)
    return _follow_status(record, op, execute)


def _follow_status(record: IdempotencyRecord, op: Operation, execute: Executor) -> Outcome | None:
    """Answer a follower by the status of the key's record (reused with the same arguments). None means:
    try to claim again."""
    match record.status:
        case RecordStatus.SUCCEEDED:
            return Outcome(record, replayed=True)
        case RecordStatus.PROCESSING:
            return Outcome(record, error=_in_progress())
        case RecordStatus.UNKNOWN:
            return Outcome(record, error=UnknownOutcome(
                f"the outcome of the first call is unknown and is being reconciled: {UNKNOWN_OUTCOME_ADVICE}"))
        case RecordStatus.FAILED:
            return _follow_failed(record, op, execute)
        case RecordStatus.AWAITING_APPROVAL:
            return hooks.follow_awaiting_approval(record)
    raise AssertionError(f"unhandled status {record.status}")


def _take_over(record: IdempotencyRecord, op: Operation) -> IdempotencyRecord:
    """The executor's lease ran out under a follower's eyes: the follower moves the record on
    itself, as the sweep would, and settles at once what can be settled (hooks.settle_expired)."""
    if expire_lease(record, actor=op.actor, source="follower"):
        try:
            hooks.settle_expired(record)
        except Exception:
            # Settling now only saves a wait: the record is UNKNOWN and due, and
            # the reconciliation sweep settles it; the caller hears so.
            logger.exception("settling record %s after its lease expired failed", record.pk)
    # Also when another follower or the sweep got there first: follow what it is now.
    return reread(record)


def _follow_failed(record: IdempotencyRecord, op: Operation, execute: Executor) -> Outcome | None:
    failure = ToolFailure.from_dict({"class": record.error_class, "message": record.error_message})
    if isinstance(failure, InternalError):
        failure = failure.replaced(details={**failure.details, "reference": str(record.operation_id)})
    if not failure.retryable:
        return Outcome(record, replayed=True, error=failure)
    if record.uncertain_runs >= conf().max_attempts_per_key:
        # Run after run of this key may have reached the downstream and each was found not done
        # afterwards: another is unlikely to fare better. A person decides (the UNKNOWN queue,
        # flagged as needing one).
        escalate_retries(record, actor=op.actor, cap=conf().max_attempts_per_key)
        return None  # follow what it is now: UNKNOWN (or whatever a racing caller made it)
    if retry_window_closed(record):
        # Every run was refused before the downstream acted, for the whole window: nothing was
        # done, and the key is closed for good (not_executed); no person is needed.
        close_retry_window(record, actor=op.actor)
        return None  # follow what it is now
    wait = retry_wait(record)
    if wait > 0:
        return Outcome(record, replayed=True, error=with_retry_window(ToolFailure.from_dict(
            {"class": record.error_class, "message": record.error_message, "retry_after": wait}), record))
    if (held := _held(op)) is not None:
        return Outcome(record, replayed=True, error=with_retry_window(held, record))
    with _holding(op) as busy:
        if busy is not None:
            return Outcome(record, replayed=True, error=with_retry_window(busy, record))
        reclaimed = reclaim(record, op)
        if reclaimed is None:
            return None  # another retry got there first; follow it
        outcome = _execute(reclaimed, op, execute)
    crash_point("after_commit")
    return outcome


def _execute(record: IdempotencyRecord, op: Operation, execute: Executor) -> Outcome:
    """Run the side effect as the record's executor, whose claim is committed, and record how it ended.

    A local effect commits with its outcome, or neither does; a downstream one is done
    before we record it (one statement).
    """
    try:
        return _effect(record, op, execute, in_claim=False)
    except Exception as exc:
        return _failed(record, op, exc)


def _effect(record: IdempotencyRecord, op: Operation, execute: Executor, *, in_claim: bool) -> Outcome:
    """The approval gate, the effect and its SUCCEEDED mark, for both executors above.

    `in_claim`: the claim's own transaction is open and uncommitted, so nobody else can see the
    record: no transaction of its own and no heartbeat. Otherwise a local effect gets a
    transaction, and every effect a heartbeat on its committed lease.
    """
    crash_point("after_claim")
    if op.approval is not None and (held := op.approval(record)) is not None:
        return held
    own_transaction = op.transactional and not in_claim
    with gathering_evidence() as evidence, transaction.atomic() if own_transaction else nullcontext():
        # The heartbeat stops before the guarded write below: a renewal
        # queued behind our own transaction's lock on the row would
        # wait for us while we wait for it. If it found the lease lost,
        # that write fails on its owner guard (LeaseLost).
        with nullcontext() if in_claim else heartbeat(record):
            result = execute(record)
        crash_point("after_downstream")
        record = mark_succeeded(record, result, actor=op.actor, evidence=evidence, search_fields=op.search_fields)
    return Outcome(record, executed=True)


def _failed(record: IdempotencyRecord, op: Operation, exc: Exception) -> Outcome:
    """Record how an execution that raised `exc` ended."""
    if isinstance(exc, UnknownOutcome):
        return Outcome(mark_unknown(record, exc, actor=op.actor), error=exc, executed=True)
    if isinstance(exc, ToolFailure):
        return _known_failure(record, op, exc)
    if isinstance(exc, LeaseLost):
        record.refresh_from_db()
        return Outcome(record, executed=True, error=UnknownOutcome(
            f"this call overran its lease and its outcome is being reconciled: {UNKNOWN_OUTCOME_ADVICE}"))
    return _unexpected_error(record, op, exc)


def _unexpected_error(record: IdempotencyRecord, op: Operation, exc: Exception) -> Outcome:
    logger.error("tool %s raised; record %s, key digest %s", op.tool, record.pk, key_digest(op.key), exc_info=exc)
    if not op.transactional:
        # We cannot tell whether the downstream request went out.
        unknown = UnknownOutcome("the call failed unexpectedly after it may have reached the downstream system; "
                                 f"it is being reconciled: {UNKNOWN_OUTCOME_ADVICE}",
                                 evidence=evidence_entry("executor", error=type(exc).__name__))
        return Outcome(mark_unknown(record, unknown, actor=op.actor), error=unknown, executed=True)
    failure: ToolFailure
    if isinstance(exc, DataError):
        # A value the database refuses (out of range, too long): running again fails the same way.
        failure = invalid_data(exc)
    elif isinstance(exc, INFRASTRUCTURE_ERRORS):
        # The database or the network failed, not the code: the transaction rolled back, so
        # nothing of the side effect committed and the same key may run again (after the
        # backoff of this attempt: mark_failed).
        failure = Transient(f"the server's infrastructure failed ({type(exc).__name__}); nothing was committed; "
                            "retry with the same key")
    else:
        # A bug: it rolled back too, but another run fails the same way. Final for this key.
        failure = internal_error(exc, record.operation_id)
    return _known_failure(record, op, failure)


def _known_failure(record: IdempotencyRecord, op: Operation, failure: ToolFailure) -> Outcome:
    """Record a failure whose meaning is known: a retryable one is a known non-execution (its retry
    window opens, and the agent hears when it ends), any other is final."""
    failure = backed_off(failure, record.attempts)
    record = mark_failed(record, failure, actor=op.actor, retry_window=op.retry_window)
    return Outcome(record, error=with_retry_window(failure, record), executed=True)


class _HeldBack(Exception):
    """A call that won its claim may not run now (`reason`: op.admit's refusal)."""

    def __init__(self, reason: ToolFailure) -> None:
        super().__init__(reason.message)
        self.reason = reason


def _admit(op: Operation) -> None:
    """Raise _HeldBack if the call must not run now (see `_held`)."""
    if (held := _held(op)) is not None:
        raise _HeldBack(held)


def _held(op: Operation) -> ToolFailure | None:
    """Why the call must not run now (op.admit: a pause, an open circuit breaker), or None."""
    if op.admit is None:
        return None
    try:
        op.admit()
    except ToolFailure as held:
        return held
    return None


def _holding(op: Operation) -> AbstractContextManager[ToolFailure | None]:
    """op.hold around one run (one operation at a time per business entity), or nothing to hold."""
    return op.hold() if op.hold is not None else nullcontext(None)


def with_retry_window(failure: ToolFailure, record: IdempotencyRecord) -> ToolFailure:
    """A retryable answer names when the key's retry window ends (`retry_until`): past it, a retry
    answers not_executed."""
    if not failure.retryable or record.retry_until is None:
        return failure
    return failure.replaced(details={**failure.details, "retry_until": record.retry_until.isoformat()})


def execute_approved(record: IdempotencyRecord, op: Operation, execute: Executor) -> Outcome | None:
    """Run an approved operation as its executor; None if the record had already left AWAITING_APPROVAL."""
    if not start_approved(record, actor=op.actor):
        return None
    outcome = _execute(record, op, execute)
    crash_point("after_commit")
    return outcome


def wait_for_outcome(record: IdempotencyRecord, then: Callable[[], T]) -> T | polling.Pending[T]:
    """`then()` once the PROCESSING `record` finishes, its lease runs out, or the follower wait runs
    out (polling.waiting: a handle on the wait, re-reading `record` in place as it checks)."""
    return polling.waiting(lambda: record.status != RecordStatus.PROCESSING or lease_expired(record), then,
                           seconds=conf().follower_wait_seconds, pause=0.01, max_pause=0.2,
                           refresh=lambda: reread(record),
                           watch=polling.Watch(db.table(IdempotencyRecord), record.pk, WAITED_ON))


# What a follower waits for: another status, or the executor's lease running out (by the database's clock).
WAITED_ON = "status || ':' || coalesce((lease_expires_at < statement_timestamp())::text, '')"


def _in_progress(message: str = "the first call with this key is still running; ask again with the same key"
                 ) -> InProgress:
    return InProgress(message, retry_after=conf().in_progress_retry_after_seconds)
