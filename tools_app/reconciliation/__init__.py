"""Reconciliation: finding out what became of UNKNOWN outcomes, never guessing; and the
operators' decisions on idempotency records.

`reconcile.py` asks a tool's reconciler (the downstream system, by the key we sent)
and applies its answer (toolkit.policies: Found, NotDone, StillUnknown), with
backoff and escalation to a person; `operators.py` holds what an operator may
decide on a record (reconcile now, resolve with evidence, force-expire a key,
release a held key), each behind its Permit; `jobs.py` the periodic work.

May import: core, access, engine, toolkit.
"""

from tools_app.reconciliation.jobs import reconcile_due, run_periodic
from tools_app.reconciliation.operators import (
    FORCE_EXPIRE,
    RECONCILE,
    RELEASE_HELD_KEY,
    RESOLVE,
    RESOLVE_PERMISSION,
    force_expire,
    reconcile,
    release_held_key,
    resolve_by_operator,
)
from tools_app.reconciliation.reconcile import (
    RECONCILE_SWEEPER,
    CallbackVerdict,
    apply_answer,
    next_attempt_in,
    reconcile_record,
    reconcile_soon,
    reconciler_for,
    settle_by_callback,
    settle_expired,
    take_turn,
)

__all__ = [
    "CallbackVerdict", "apply_answer", "settle_by_callback",
    "FORCE_EXPIRE", "RECONCILE", "RELEASE_HELD_KEY", "RESOLVE", "RESOLVE_PERMISSION", "RECONCILE_SWEEPER",
    "force_expire",
    "next_attempt_in", "reconcile", "reconcile_due", "reconcile_record", "reconcile_soon", "reconciler_for",
    "release_held_key", "resolve_by_operator", "run_periodic", "settle_expired", "take_turn",
]
