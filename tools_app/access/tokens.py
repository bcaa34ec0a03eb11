"""Agents' API tokens: a tenant's bearer secrets for /mcp (issued, checked and revoked by secrets.py).

A token is shown once, at issue, and stored only as a SHA-256 digest.
"""

from __future__ import annotations

from django.db import transaction

from tools_app.access import secrets
from tools_app.access.models import ApiToken, Tenant
from tools_app.core import audit

TOKEN_PREFIX = "idm_"


@transaction.atomic
def issue_token(tenant: Tenant, name: str, *, actor: str = audit.SYSTEM) -> tuple[ApiToken, str]:
    """Create a token; the raw value is returned here and never again."""
    issued = secrets.new(TOKEN_PREFIX)
    token = ApiToken.objects.create(tenant=tenant, name=name, digest=issued.digest, prefix=issued.prefix)
    audit.record_event(action="token.issued", obj=token, actor=actor, after={"name": name, "prefix": token.prefix})
    return token, issued.raw


def revoke_token(token: ApiToken, *, actor: str, reason: str = "") -> bool:
    return secrets.revoke(token, action="token.revoked", actor=actor, reason=reason)


def authenticate_token(raw_token: str) -> ApiToken | None:
    """The live token for a raw bearer value, or None (with its tenant and the tenant's limits)."""
    return secrets.find(ApiToken.objects.select_related("tenant", "tenant__limits"), raw_token, TOKEN_PREFIX)
