"""Agents' API tokens: a tenant's bearer secrets for /mcp (issued, checked and revoked by secrets.py).

A token is shown once, at issue, and stored only as a SHA-256 digest. Every token has an owner:
the person responsible for that agent. Four eyes: the owner never approves what the agent asks
for (tools_app.approvals.decisions), so an agent and its owner cannot wave an operation through.

Every MCP call presents its token, so a verified token is kept in the process for
IDEMOPS_TOKEN_CACHE_SECONDS (keyed by its digest: the raw value is not kept): a call then
verifies it without a query. Revoking drops it from the revoking process's cache at once;
another process refuses it once its entry is older than that period.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from django.db import transaction

from tools_app.access import secrets
from tools_app.access.models import AGENT, OAUTH_AGENT, AgentConnection, ApiToken, Tenant
from tools_app.conf import conf
from tools_app.core import audit, db

if TYPE_CHECKING:
    from django.contrib.auth.models import User

TOKEN_PREFIX = "idm_"


@transaction.atomic
def issue_token(tenant: Tenant, name: str, *, owner: User | None, actor: str = audit.SYSTEM) -> tuple[ApiToken, str]:
    """Create a token owned by `owner` (a user); the raw value is returned here and never again."""
    if owner is None or owner.pk is None:
        raise ValueError("an agent token needs an owner: the person responsible for the agent")
    if ":" in name:  # `oauth:<id>` names an OAuth agent (models.OAUTH_AGENT): no token may look like one
        raise ValueError("a token's name may not contain ':'")
    issued = secrets.new(TOKEN_PREFIX)
    token = ApiToken.objects.create(tenant=tenant, name=name, digest=issued.digest, prefix=issued.prefix,
                                    owner=owner)
    audit.record_event(action="token.issued", obj=token, actor=actor,
                       after={"name": name, "prefix": token.prefix, "owner": owner.get_username()})
    return token, issued.raw


def set_owner(token: ApiToken, owner: User, *, actor: str, reason: str = "") -> bool:
    """Hand the agent to another person (or give a token from before owners existed its first one).
    False: `owner` owns it already."""
    if token.owner_id == owner.pk:
        return False
    before = token.owner.get_username() if token.owner is not None else None
    return db.transition(token, {"owner_id": token.owner_id}, {"owner_id": owner.pk}, action="token.owner_changed",
                         actor=actor, reason=reason, before={"owner": before}, after={"owner": owner.get_username()})


def revoke_token(token: ApiToken, *, actor: str, reason: str = "") -> bool:
    _verified.pop(token.digest, None)
    return secrets.revoke(token, action="token.revoked", actor=actor, reason=reason)


# digest -> (the live token, time.monotonic() when it was read). Only live tokens are kept: an
# unknown or revoked value is read again each time (nothing an attacker sends fills the cache).
_verified: dict[str, tuple[ApiToken, float]] = {}


def cached_token(raw_token: str) -> ApiToken | None:
    """The live token for a raw bearer value if this process verified it recently, else None
    (then ask `authenticate_token`). Makes no query, so it may run on the event loop."""
    entry = _verified.get(secrets.digest(raw_token))
    if entry is None or time.monotonic() - entry[1] >= conf().token_cache_seconds:
        return None
    return entry[0]


def authenticate_token(raw_token: str) -> ApiToken | None:
    """The live token for a raw bearer value, or None (with its tenant and the tenant's limits)."""
    token = cached_token(raw_token)
    if token is not None:
        return token
    read_at = time.monotonic()
    token = secrets.find(ApiToken.objects.select_related("tenant", "tenant__limits"), raw_token, TOKEN_PREFIX)
    if token is not None and conf().token_cache_seconds > 0:
        _verified[token.digest] = (token, read_at)
    return token


def owner_id_of(tenant_id: int, actor: str) -> int | None:
    """The owner of the agent whose identity is `actor` (ApiToken.agent_identity, or an OAuth agent's
    AgentConnection.agent_identity: the person who consented), or None: not an agent's identity, or a
    token without an owner. Token names are unique per tenant, revoked ones included."""
    slug, slash, name = actor.removeprefix(AGENT).partition("/")
    if not actor.startswith(AGENT) or not slash:
        return None
    if name.startswith(OAUTH_AGENT):
        connection_id = name.removeprefix(OAUTH_AGENT)
        return AgentConnection.objects.filter(pk=int(connection_id), tenant_id=tenant_id).values_list(
            "user_id", flat=True).first() if connection_id.isdigit() else None
    return ApiToken.objects.filter(tenant_id=tenant_id, tenant__slug=slug, name=name).values_list(
        "owner_id", flat=True).first()
