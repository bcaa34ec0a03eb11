"""Tenants, their API tokens, and who may act on a tenant's objects.

Tokens are shown once, at issue, and stored only as a SHA-256 digest.

`authorize` is the one check of every operation an operator (or an agent)
can reach: each concept function calls it with its `Permit` before it
changes anything, so no entry point (admin, command, API, MCP) can skip it.
Periodic jobs call the concepts' internal functions instead: they act for
the system, not for a person.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from tools_app.access.models import ApiToken, Tenant, TenantAccess
from tools_app.core import audit
from tools_app.core.errors import PermissionDenied

TOKEN_PREFIX = "idm_"
# last_used_at is informational; refreshing it at most this often keeps the
# authentication of every MCP call a read.
LAST_USED_RESOLUTION = timedelta(minutes=1)


def token_digest(raw_token: str) -> str:
    return hashlib.sha256(raw_token.encode()).hexdigest()


@transaction.atomic
def create_tenant(slug: str, name: str = "", *, actor: str = audit.SYSTEM) -> Tenant:
    tenant = Tenant.objects.create(slug=slug, name=name or slug)
    audit.record_event(action="tenant.created", obj=tenant, actor=actor, tenant_id=tenant.pk)
    return tenant


@transaction.atomic
def issue_token(tenant: Tenant, name: str, *, actor: str = audit.SYSTEM) -> tuple[ApiToken, str]:
    """Create a token; the raw value is returned here and never again."""
    raw = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = ApiToken.objects.create(tenant=tenant, name=name, digest=token_digest(raw), prefix=raw[:12])
    audit.record_event(action="token.issued", obj=token, actor=actor, after={"name": name, "prefix": token.prefix})
    return token, raw


@transaction.atomic
def revoke_token(token: ApiToken, *, actor: str, reason: str = "") -> bool:
    revoked = ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(revoked_at=timezone.now())
    if revoked:
        audit.record_event(action="token.revoked", obj=token, actor=actor, reason=reason)
    return bool(revoked)


def authenticate_token(raw_token: str) -> ApiToken | None:
    """The live token for a raw bearer value, or None."""
    if not raw_token.startswith(TOKEN_PREFIX):
        return None
    token = (
        ApiToken.objects.select_related("tenant")
        .filter(digest=token_digest(raw_token), revoked_at__isnull=True)
        .first()
    )
    if token is None:
        return None
    now = timezone.now()
    if token.last_used_at is None or token.last_used_at < now - LAST_USED_RESOLUTION:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token


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


def authorize(who, permit: Permit, obj) -> str:
    """The actor name of `who` (an operator's user, or an Agent) if it may do `permit`'s operation on `obj`.

    A person needs the permission and `obj`'s tenant among those they may
    see; an agent needs an operation open to agents, on its own tenant.
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
        elif (visible := visible_tenant_ids(who)) is not None and obj.tenant_id not in visible:
            refusal = f"this {obj._meta.verbose_name} belongs to a tenant you may not see"
        else:
            return actor
    audit_refusal(permit, obj, actor, refusal)
    raise PermissionDenied(refusal)


def audit_refusal(permit: Permit, obj, actor: str, refusal: str) -> None:
    """The audit event of a refused attempt (also for a concept's own rules, e.g. no self-approval)."""
    with transaction.atomic():
        audit.record_event(action=permit.refused_event, obj=obj, actor=actor, reason=refusal,
                           trace_id=getattr(obj, "trace_id", ""), after={"attempted": permit.attempted})


def visible_tenant_ids(user) -> set[int] | None:
    """The tenants a user may see: None means all (superusers)."""
    if user.is_superuser:
        return None
    return set(TenantAccess.objects.filter(user=user).values_list("tenant_id", flat=True))
