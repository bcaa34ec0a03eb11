"""Operators' decisions on idempotency records, each behind its Permit (access.authorize).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tools_app import access, engine
from tools_app.core.errors import InvalidInput, Transient
from tools_app.engine import evidence_entry
from tools_app.engine.models import IdempotencyRecord, RecordStatus
from tools_app.reconciliation.reconcile import observed, reconcile_record
from tools_app.toolkit.registry import get_tool, sent_call

if TYPE_CHECKING:
    from django.contrib.auth.models import AnonymousUser, User

RESOLVE_PERMISSION = "tools_app.resolve_unknown"
RECONCILE = access.Permit(RESOLVE_PERMISSION, "reconcile", "reconcile UNKNOWN outcomes", "record.reconcile_refused")
RESOLVE = access.Permit(RESOLVE_PERMISSION, "resolve", "resolve UNKNOWN outcomes", "record.resolve_refused")
FORCE_EXPIRE = access.Permit("tools_app.force_expire_idempotencyrecord", "force_expire",
                              "force-expire idempotency keys", "record.force_expire_refused")
RELEASE_HELD_KEY = access.Permit("tools_app.release_held_key", "release_held_key",
                                  "release held idempotency keys", "record.release_refused")


def force_expire(record: IdempotencyRecord, user: User | AnonymousUser, *, reason: str) -> bool:
    """An operator ends a finished record's retention now: the key's expiry policy applies from the next call."""
    actor = access.authorize(user, FORCE_EXPIRE, record)
    if not reason.strip():
        raise InvalidInput("force-expiring a key needs a reason")
    return engine.end_retention(record, actor=actor, reason=reason)


def release_held_key(record: IdempotencyRecord, user: User | AnonymousUser, *, reason: str, checked: str,
                     downstream_reference: str = "") -> bool:
    """An operator frees a key held past its retention (ExpiryPolicy.HOLD), after checking downstream.

    The record is retired as `retire` does: its row stays for auditors, and
    the next call with the key runs as a new operation (with a new
    downstream key, so the downstream system does not answer it with the old
    effect). What the operator checked is kept as evidence on the record and
    in the audit event.
    """
    actor = access.authorize(user, RELEASE_HELD_KEY, record)
    if not reason.strip() or not checked.strip():
        raise InvalidInput("releasing a held key needs a reason and what you checked downstream "
                           "(e.g. the payment id found, or 'no payment at the gateway for this key')")
    return engine.release(record, actor=actor, reason=reason, checked=checked,
                          downstream_reference=downstream_reference)


def reconcile(record: IdempotencyRecord, user: User | AnonymousUser) -> str:
    """An operator's "reconcile now": ask the downstream system at once, due or not."""
    actor = access.authorize(user, RECONCILE, record)
    record.refresh_from_db()
    if record.status != RecordStatus.UNKNOWN:
        raise InvalidInput("this record is no longer UNKNOWN; reload it")
    # Due or not, and even while the loop asks too: both only read downstream, and the guarded
    # transition lets one answer win (reconcile_record then reports the record as it is).
    return reconcile_record(record, actor=actor)


def resolve_by_operator(record: IdempotencyRecord, user: User | AnonymousUser, *, succeeded: bool, reason: str,
                        downstream_reference: str = "") -> None:
    """An operator's decision on an UNKNOWN record, with evidence. Refusals are audited too."""
    actor = access.authorize(user, RESOLVE, record)
    if not reason.strip():
        raise InvalidInput("a resolution needs a reason")
    evidence = evidence_entry("operator", actor=actor, reason=reason, downstream_reference=downstream_reference)
    if succeeded:
        spec = get_tool(record.tool)
        if not downstream_reference or spec.result_for_reference is None:
            raise InvalidInput("resolving as succeeded needs a downstream reference this tool can look up")
        result = spec.result_for_reference(sent_call(record, spec), downstream_reference)
        done = engine.resolve_succeeded(record, result, actor=actor, reason=reason, evidence=evidence,
                                         search_fields=spec.search_fields)
    else:
        failure = Transient(f"an operator found the first call did not take effect: {reason}", retry_after=0)
        # A person checked: the key may run again, with a new budget of runs (escalate_retries).
        done = engine.resolve_failed(record, failure, actor=actor, reason=reason, evidence=evidence,
                                     fresh_attempts=True)
    if not done:
        raise InvalidInput("this record is no longer UNKNOWN; reload it")
    observed(record, "succeeded" if succeeded else "failed", actor=actor)
