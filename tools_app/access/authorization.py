"""Who may act on a tenant's objects, and which tenants' rows anyone may see.

`authorize` is the one check of every operation an operator (or an agent)
can reach: each concept function calls it with its `Permit` before it
changes anything, so no entry point (admin, command, API, MCP) can skip it.
Periodic jobs call the concepts' internal functions instead: they act for
the system, not for a person.

`scope` is the one tenant filter of every list shown to a person or an
auditor (admin pages, the auditors' API, the dashboard): a superuser sees
every tenant, anyone else only those granted to them (TenantAccess), an
auditor key only those granted to the key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from django.db import transaction
from django.db.models import Model, QuerySet

from tools_app.access.auditors import KeyAuditor
from tools_app.access.models import TenantAccess
from tools_app.access.second_factor import SecondFactorRequired, verified
from tools_app.core import audit
from tools_app.core.errors import PermissionDenied

if TYPE_CHECKING:
    from django.contrib.auth.models import AnonymousUser, User

_M = TypeVar("_M", bound=Model)

SECOND_FACTOR_REFUSAL = ("second factor required: enter a code from your authenticator (the console's "
                         "second-factor page) before you change anything")


@dataclass(frozen=True)
class Permit:
    """What one operator operation needs: a permission, on the object's tenant.

    Declared once, next to the operation in its concept module. The operation
    calls `authorize` with it first thing, whoever called it; the admin asks
    the same Permit before it shows a button or a confirmation form.
    """

    permission: str  # e.g. "tools_app.force_expire_idempotencyrecord"
    attempted: str  # the operation's name in refusal events, e.g. "force_expire"
    what: str  # completes "you do not have the permission to ...", e.g. "force-expire idempotency keys"
    refused_event: str  # the audit action of a refusal, e.g. "record.force_expire_refused"
    agents: bool = False  # whether the tenant's agent (its API token) may do it on the tenant's objects


@dataclass(frozen=True)
class Agent:
    """An MCP caller, authenticated by its tenant's API token: it acts on that tenant's objects only."""

    tenant_id: int
    actor: str


def authorize(who: Agent | User | AnonymousUser, permit: Permit, obj: Any) -> str:  # obj: see _tenants_of
    """The actor name of `who` (an operator's user, or an Agent) if it may do `permit`'s operation on `obj`.

    A person needs the permission, `obj`'s tenant among those they may see,
    and a session verified by a second factor (access.second_factor); an
    agent needs an operation open to agents, on its own tenant.
    Anything else is refused: the refusal is audited, then PermissionDenied
    is raised. Call it before opening the operation's transaction, so the
    refusal's event commits although the operation does not happen.
    """
    if isinstance(who, Agent):
        actor = who.actor
        if not permit.agents:
            refusal = f"agents may not {permit.what}"
        elif obj.tenant_id != who.tenant_id:
            refusal = f"this {obj._meta.verbose_name} belongs to another tenant"
        else:
            return actor
    else:
        actor = audit.user_actor(who)
        if not who.has_perm(permit.permission):
            refusal = f"missing permission: you do not have the permission to {permit.what}"
        elif (visible := visible_tenant_ids(who)) is not None and not _tenants_of(obj) <= visible:
            refusal = f"this {obj._meta.verbose_name} belongs to a tenant you may not see"
        elif not verified(who):
            # Checked here, for every operation and every entry point: a password alone changes nothing.
            refusal = SECOND_FACTOR_REFUSAL
            audit_refusal(permit, obj, actor, refusal)
            raise SecondFactorRequired(refusal)
        else:
            return actor
    audit_refusal(permit, obj, actor, refusal)
    raise PermissionDenied(refusal)


def _tenants_of(obj: Any) -> set[int]:
    """The tenants of `obj`: a tenant's row (`tenant_id`), a row over several (`tenant_ids`, e.g. a bulk
    action's selection), or a model class when the attempt names no single row (each row checked later)."""
    if isinstance(obj, type):
        return set()
    tenant_ids = getattr(obj, "tenant_ids", None)
    return set(tenant_ids) if tenant_ids is not None else {obj.tenant_id}


def audit_refusal(permit: Permit, obj: Model | type[Model], actor: str, refusal: str) -> None:
    """The audit event of a refused attempt (also for a concept's own rules, e.g. no self-approval).
    `obj` may be a model class when the attempt named no single row (an action on "all of them")."""
    with transaction.atomic():
        audit.record_event(action=permit.refused_event, obj=obj, actor=actor, reason=refusal,
                           trace_id=getattr(obj, "trace_id", ""), after={"attempted": permit.attempted})


def visible_tenant_ids(who: Any) -> set[int] | None:
    """The tenants a user or an auditor key may see: None means all (superusers only)."""
    if isinstance(who, KeyAuditor):
        return set(who.tenant_ids)
    if who.is_superuser:
        return None
    # Read once per user object, as Django caches a user's permissions on it (`_perm_cache`): a request's
    # user is loaded afresh for each request, and one console page scopes a dozen querysets.
    cached: set[int] | None = getattr(who, _VISIBLE_CACHE, None)
    if cached is None:
        cached = set(TenantAccess.objects.filter(user=who).values_list("tenant_id", flat=True))
        setattr(who, _VISIBLE_CACHE, cached)
    return set(cached)


_VISIBLE_CACHE = "_visible_tenant_ids"


def forget_visible_tenants(user: Any) -> None:
    """Drop visible_tenant_ids' cache on `user`, after a change to the tenants it may see."""
    user.__dict__.pop(_VISIBLE_CACHE, None)


def scope(queryset: QuerySet[_M], who: Any, field: str = "tenant_id") -> QuerySet[_M]:
    """`queryset` narrowed to the tenants `who` (a user or an auditor key) may see.

    `field` is the lookup path to the tenant id, e.g. "task__tenant_id" for a
    row whose tenant is its task's. Applied to the queryset itself, so a
    detail page, an action, a filter or an export built on it cannot reach past it.
    """
    visible = visible_tenant_ids(who)
    if visible is None:
        return queryset
    return queryset.filter(**{f"{field}__in": visible})
