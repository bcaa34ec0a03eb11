"""Tenants and their API tokens.

Tokens are shown once, at issue, and stored only as a SHA-256 digest.
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from tools_app import audit
from tools_app.errors import PermissionDenied
from tools_app.models import ApiToken, Tenant, TenantAccess

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


def authorize(user, permission: str, obj, *, action: str, what: str) -> str:
    """The actor name of an operator allowed to `what` (e.g. "resolve UNKNOWN outcomes") on `obj`.

    Needs `permission` and `obj`'s tenant among those the user may see. The
    admin only hides what a user may not do; this enforces it, and a refusal
    is audited (as `action`) before it is raised.
    """
    actor = audit.user_actor(user)
    visible = visible_tenant_ids(user)
    if not user.has_perm(permission):
        refusal = f"you do not have the permission to {what}"
    elif visible is not None and obj.tenant_id not in visible:
        refusal = f"this {obj._meta.verbose_name} belongs to a tenant you may not see"
    else:
        return actor
    with transaction.atomic():
        audit.record_event(action=action, obj=obj, actor=actor, reason=refusal)
    raise PermissionDenied(refusal)


def visible_tenant_ids(user) -> set[int] | None:
    """The tenants a user may see: None means all (superusers)."""
    if user.is_superuser:
        return None
    return set(TenantAccess.objects.filter(user=user).values_list("tenant_id", flat=True))
