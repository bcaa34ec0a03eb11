"""The idempotency engine: a write call's side effect commits once, and every retry gets the first answer.

Owns the IdempotencyRecord and every change of it. Read `run.py` for how a call
is claimed, executed or followed, `claims.py` for the claim of a key (and the
reclaim of a transient failure), `transitions.py` for each guarded state
change after it, `lookup.py` for finding records by key, digest or downstream key,
`operation.py` for what the engine is given and answers, `prepared.py` for
operation ids issued before the call (prepare_operation), and `hooks.py` for
how the packages built on it (approvals, reconciliation) tell it what it does
not know itself.

May import: tools_app.core only (and Django, and the settings object `tools_app.conf`). Approvals,
reconciliation, tasks and the tools build on it; it never imports them.
"""

from tools_app.engine.claims import (
    claim,
    claim_operation_id,
    claimed_in_flight,
    downstream_key,
    new_record,
    operation_id_of,
    reclaim,
)
from tools_app.engine.hooks import hooks
from tools_app.engine.lookup import records_with_key, records_with_key_digest
from tools_app.engine.operation import (
    ATTRIBUTE_MAX,
    DEFAULT_RETENTION,
    OPERATION_ID_REQUIRED,
    Executor,
    ExpiryPolicy,
    LeaseLost,
    Operation,
    Outcome,
    evidence_entry,
    gathering_evidence,
    note_evidence,
    operation_id_spent,
    searchable,
)
from tools_app.engine.prepared import issue, issued_operation_id, valid_unused
from tools_app.engine.run import execute_approved, run, start, wait_for_outcome
from tools_app.engine.transitions import (
    FINISHED,
    LEASE_SWEEPER,
    await_approval,
    close_unapproved,
    end_retention,
    expire_lease,
    expire_leases,
    heartbeat_interval,
    hold_while_ongoing,
    is_expired,
    lease_expired,
    lease_seconds,
    mark_failed,
    mark_succeeded,
    mark_unknown,
    note_unresolved,
    release,
    renew_lease,
    reread,
    resolve_failed,
    resolve_succeeded,
    retain_from_end,
    retention_ends_at,
    retention_from_end_with,
    retire,
    start_approved,
)

__all__ = [
    "ATTRIBUTE_MAX",
    "DEFAULT_RETENTION", "FINISHED", "OPERATION_ID_REQUIRED", "LEASE_SWEEPER", "Executor", "ExpiryPolicy", "LeaseLost",
    "Operation", "Outcome", "await_approval", "claim", "claim_operation_id", "claimed_in_flight",
    "close_unapproved", "downstream_key", "end_retention",
    "evidence_entry", "execute_approved", "expire_lease", "expire_leases", "gathering_evidence",
    "heartbeat_interval", "hooks", "is_expired", "issue", "issued_operation_id", "lease_expired", "lease_seconds",
    "mark_failed", "mark_succeeded", "mark_unknown", "new_record", "note_evidence", "note_unresolved",
    "operation_id_of", "operation_id_spent", "reclaim", "records_with_key", "records_with_key_digest", "release",
    "renew_lease", "reread", "resolve_failed", "resolve_succeeded", "retire", "run", "searchable", "start",
    "start_approved", "valid_unused",
    "wait_for_outcome",
    # Keys of operations that go on after their call (long tasks).
    "hold_while_ongoing", "retain_from_end", "retention_ends_at", "retention_from_end_with",
]
