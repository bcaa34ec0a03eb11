"""A circuit breaker per downstream system, shared by every process through its Downstream row.

closed --(IDEMOPS_BREAKER_FAILURES definite failures or timeouts within the window)--> open
open --(next_probe_at passed; one call takes the probe)--> probing
probing --(the probe's request succeeds)--> closed;  --(it fails)--> open, next probe later

While open (and while another call probes), calls to the downstream's tools answer `transient` with
`retry_after` set to the next probe, before anything is claimed, run or counted (gate.admit). Every
state change is a guarded transition with its audit event (core.db.transition); counting a failure
is one upsert, not a state change.

A probe whose call never reaches the downstream (the call failed before sending, its process died)
holds the probe until its lease (`probe_until`) runs out; then the next call takes it.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import TYPE_CHECKING

from tools_app import access
from tools_app.conf import conf
from tools_app.core import clock, db
from tools_app.core.errors import Held
from tools_app.incidents import state
from tools_app.incidents.models import BreakerState, Downstream, Pause, PauseScope
from tools_app.incidents.pauses import PAUSE

if TYPE_CHECKING:
    from django.contrib.auth.models import AnonymousUser, User

logger = logging.getLogger(__name__)
SYSTEM = "system:circuit-breaker"


def probe_lease() -> float:
    """How long a probe may take before another call may probe instead."""
    return max(conf().breaker_open_seconds, 30.0)


def admit(downstream: str, seen: state.Breaker, current: state.Snapshot) -> None:
    """Raise Transient while `downstream`'s breaker holds calls back; take the probe when one is due."""
    now = current.now()
    if seen.state == BreakerState.CLOSED or now is None:
        return
    due = seen.next_probe_at if seen.state == BreakerState.OPEN else seen.probe_until
    if due is not None and due > now:
        raise held(downstream, seen, (due - now).total_seconds())
    if not take_probe(downstream):
        raise held(downstream, seen, 1.0)


def held(downstream: str, seen: state.Breaker, wait: float) -> Held:
    last = f"; the last failure: {seen.last_failure}" if seen.last_failure else ""
    return Held(f"the downstream system {downstream} is failing and its circuit breaker is open{last}; nothing "
                     "was done and no run was counted; retry with the same key after retry_after (when one call "
                     "tests it again)", retry_after=max(wait, 0.5), details={"circuit_open": downstream})


def take_probe(downstream: str) -> bool:
    """Whether this call is the one to test an open breaker's downstream (of every process, one is)."""
    row = Downstream.objects.filter(name=downstream).first()
    if row is None:
        return True  # gone: nothing holds calls back
    if row.state == BreakerState.OPEN:
        taken = db.transition(row, {"state": BreakerState.OPEN, "next_probe_at__lte": clock.NOW}, {
            "state": BreakerState.PROBING, "probe_until": clock.later(probe_lease()), "updated_at": clock.NOW,
        }, action="breaker.probing", actor=SYSTEM, before={"state": row.state}, after={"state": "probing"})
    elif row.state == BreakerState.PROBING:
        taken = db.transition(row, {"state": BreakerState.PROBING, "probe_until__lt": clock.NOW}, {
            "probe_until": clock.later(probe_lease()), "updated_at": clock.NOW,
        }, action="breaker.probing", actor=SYSTEM, reason="the previous probe never reported",
            before={"state": row.state}, after={"state": "probing"})
    else:
        return True
    state.forget()
    return taken


def record_failure(downstream: str, what: str) -> None:
    """A definite failure or a timeout of a request to `downstream`: counted in the window; the
    count reaching IDEMOPS_BREAKER_FAILURES opens the breaker, and a failed probe opens it again."""
    threshold = conf().breaker_failures
    if threshold == 0:
        return
    window = timedelta(seconds=conf().breaker_window_seconds)
    table = db.table(Downstream)
    row = db.fetchone(
        f"INSERT INTO {table} (name, state, failures, window_started_at, last_failure, updated_at) "
        "VALUES (%s, %s, 1, statement_timestamp(), %s, statement_timestamp()) "
        "ON CONFLICT (name) DO UPDATE SET "
        f"failures = CASE WHEN {table}.window_started_at > statement_timestamp() - %s "
        f"THEN {table}.failures + 1 ELSE 1 END, "
        f"window_started_at = CASE WHEN {table}.window_started_at > statement_timestamp() - %s "
        f"THEN {table}.window_started_at ELSE statement_timestamp() END, "
        "last_failure = excluded.last_failure, updated_at = statement_timestamp() "
        "RETURNING id, state, failures", [downstream, BreakerState.CLOSED, what[:500], window, window])
    assert row is not None
    pk, current, failures = row
    if current == BreakerState.CLOSED and failures >= threshold:
        window_text = f"{conf().breaker_window_seconds:g}s"
        _open(pk, downstream, current, reason=f"{failures} failures within {window_text}; the last: {what}"[:500])
    elif current == BreakerState.PROBING:
        _open(pk, downstream, current, reason=f"the probe failed: {what}"[:500])


def _open(pk: int, downstream: str, current: str, *, reason: str) -> None:
    row = Downstream(pk=pk, name=downstream, state=current)
    if db.transition(row, {"state": current}, {
        "state": BreakerState.OPEN, "failures": 0, "opened_at": clock.NOW, "probe_until": None,
        "next_probe_at": clock.later(conf().breaker_open_seconds), "updated_at": clock.NOW,
    }, action="breaker.opened", actor=SYSTEM, reason=reason, before={"state": current}, after={"state": "open"}):
        logger.warning("circuit breaker of %s opened: %s", downstream, reason)
        state.forget()


def record_success(downstream: str) -> None:
    """A request to `downstream` succeeded: a probe closes the breaker; failures counted so far are
    forgotten. Nothing is written for a downstream this process last saw plainly closed."""
    if conf().breaker_failures == 0 or downstream not in state.snapshot().breakers:
        return
    row = Downstream.objects.filter(name=downstream).first()
    if row is None:
        return
    if row.state == BreakerState.PROBING:
        if db.transition(row, {"state": BreakerState.PROBING}, {
            "state": BreakerState.CLOSED, "failures": 0, "probe_until": None, "next_probe_at": None,
            "window_started_at": None, "updated_at": clock.NOW,
        }, action="breaker.closed", actor=SYSTEM, reason="the probe succeeded", before={"state": "probing"},
                after={"state": "closed"}):
            logger.info("circuit breaker of %s closed: the probe succeeded", downstream)
            state.forget()
    elif row.state == BreakerState.CLOSED and row.failures:
        Downstream.objects.filter(pk=row.pk, state=BreakerState.CLOSED).update(failures=0, window_started_at=None)


def reset(downstream: Downstream, user: User | AnonymousUser, *, reason: str) -> bool:
    """An operator closes a breaker by hand (the downstream is known to be back). A breaker's state
    belongs to no tenant: who may pause its downstream (pauses.PAUSE, for every tenant) may close it."""
    actor = access.authorize(user, PAUSE, Pause(scope=PauseScope.DOWNSTREAM, target=downstream.name))
    done = db.transition(downstream, {"state__in": [BreakerState.OPEN, BreakerState.PROBING]}, {
        "state": BreakerState.CLOSED, "failures": 0, "probe_until": None, "next_probe_at": None,
        "window_started_at": None, "updated_at": clock.NOW,
    }, action="breaker.closed", actor=actor, reason=reason, before={"state": downstream.state},
        after={"state": "closed"})
    state.forget()
    return done
