"""Operators pause and resume a tool, a downstream system or one tenant's writes.

While a pause stands, calls it covers answer `transient` with retry_after and the operator's
reason: nothing runs and no run is counted (gate.admit); a long task whose next step needs it waits,
visibly, and goes on after the resume. Both are audited; both need PAUSE (a tenant's pause, that
tenant among those the operator may see; a tool's or a downstream's pause holds for every tenant,
so only an operator who sees every tenant may set it) and, like every operator action, a session
verified by a second factor (access.authorize).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.db import IntegrityError, transaction

from tools_app import access
from tools_app.access.models import Tenant
from tools_app.core import audit, clock
from tools_app.core.errors import Held, InvalidInput
from tools_app.incidents import state
from tools_app.incidents.models import Pause, PauseScope

if TYPE_CHECKING:
    from django.contrib.auth.models import AnonymousUser, User

PAUSE = access.Permit("tools_app.pause_operations", "pause", "pause and resume tools, downstream systems and "
                      "tenants' writes", "pause.refused")

# retry_after of a paused call: the pause's end is a person's decision, so the agent asks again soon.
PAUSED_RETRY_AFTER_SECONDS = 10.0


def paused(what: str, reason: str) -> Held:
    """What a call covered by a pause answers."""
    return Held(f"an operator paused {what} ({reason}); nothing was done and no run was counted; retry "
                     "with the same key after retry_after", retry_after=PAUSED_RETRY_AFTER_SECONDS,
                     details={"paused": what, "paused_reason": reason})


def pause(scope: PauseScope, target: str, user: User | AnonymousUser, *, reason: str) -> Pause:
    """Pause `target` (a tool's or a downstream's name, or a tenant's slug) for every call from now
    (within IDEMOPS_INCIDENT_STATE_SECONDS in every process). The caller names a tool or downstream
    that exists (the entry points check it against the registry)."""
    row = _subject(scope, target)
    actor = access.authorize(user, PAUSE, row)
    if not reason.strip():
        raise InvalidInput("a pause needs a reason: the agents hear it")
    row.reason, row.paused_by = reason.strip()[:1000], actor
    try:
        with transaction.atomic():
            row.paused_at = clock.read()
            row.save()
            audit.record_event(action="pause.started", obj=row, actor=actor, reason=row.reason,
                               after={"scope": scope, "target": row.target})
    except IntegrityError:
        raise InvalidInput(f"{scope} {target} is paused already") from None
    state.forget()
    return row


def resume(scope: PauseScope, target: str, user: User | AnonymousUser, *, reason: str = "") -> bool:
    """End the pause of `target`; False if it was not paused."""
    key = _subject(scope, target)
    row = Pause.objects.filter(scope=scope, target=key.target).first() or key
    actor = access.authorize(user, PAUSE, row)
    with transaction.atomic():
        deleted, _ = Pause.objects.filter(scope=scope, target=key.target).delete()
        if deleted:
            audit.record_event(action="pause.ended", obj=row, actor=actor, reason=reason,
                               before={"scope": scope, "target": key.target, "reason": row.reason})
    state.forget()
    return bool(deleted)


def _subject(scope: PauseScope, target: str) -> Pause:
    """An unsaved Pause naming what `target` is, for authorization before anything is written."""
    if scope not in PauseScope.values:
        raise InvalidInput(f"scope must be one of {', '.join(PauseScope.values)}")
    if scope == PauseScope.TENANT:
        tenant = Tenant.objects.filter(slug=target).first()
        if tenant is None:
            raise InvalidInput(f"no tenant {target!r}")
        return Pause(scope=scope, target=str(tenant.pk), tenant=tenant)
    if not target.strip() or len(target) > 200:
        raise InvalidInput(f"a {scope} is named by 1 to 200 characters")
    return Pause(scope=scope, target=target.strip())

