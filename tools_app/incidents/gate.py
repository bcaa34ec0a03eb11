"""May a write run now? The one question asked before each run of a write (engine.Operation.admit)
and before each step of a long task: not while an operator paused the tool, its downstream or the
tenant's writes, nor while the downstream's circuit breaker is open (unless this call is its probe).

Answered from the process's snapshot (incidents.state): nothing is asked of the database unless a
breaker is due a probe.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from tools_app.incidents import breaker, state
from tools_app.incidents.models import PauseScope
from tools_app.incidents.pauses import paused

# The downstream this call was admitted to (and may be probing): its request is not held back again.
_admitted: ContextVar[str | None] = ContextVar("admitted_downstream", default=None)


@contextmanager
def admission() -> Iterator[None]:
    """The scope of one call: what `admit` let through holds inside it, and is forgotten after."""
    token = _admitted.set(None)
    try:
        yield
    finally:
        _admitted.reset(token)


def admit(tenant_id: int, tool: str, declared_downstream: str | None) -> None:
    """Raise Transient (with retry_after and the reason) if a call of `tool` for `tenant_id` must not
    run now. Else return: the call may run, and if its downstream's breaker was due a probe, this
    call is the probe."""
    current = state.snapshot()
    downstream = state.downstream_of(tool, declared_downstream)
    if current.pauses:
        for scope, target, what in ((PauseScope.TOOL, tool, f"the tool {tool}"),
                                    (PauseScope.DOWNSTREAM, downstream, f"the downstream system {downstream}"),
                                    (PauseScope.TENANT, str(tenant_id), "this tenant's writes")):
            if target is not None and (reason := current.pauses.get((scope, target))) is not None:
                raise paused(what, reason)
    if downstream is not None and (seen := current.breakers.get(downstream)) is not None:
        breaker.admit(downstream, seen, current)
    _admitted.set(downstream)


def admit_request(downstream: str) -> None:
    """Before a request to `downstream` leaves (toolkit.downstream): held back as `admit` would,
    unless this call was admitted to it already (its tool declared it, or was known to use it)."""
    if _admitted.get() == downstream:
        return
    current = state.snapshot()
    if (reason := current.pauses.get((PauseScope.DOWNSTREAM, downstream))) is not None:
        raise paused(f"the downstream system {downstream}", reason)
    if (seen := current.breakers.get(downstream)) is not None:
        breaker.admit(downstream, seen, current)
