"""Agents' API tokens: a tenant's bearer secrets for /mcp (issued, checked and revoked by secrets.py).

A token is shown once, at issue, and stored only as a SHA-256 digest.

Every MCP call presents its token, so a verified token is kept in the process for
IDEMOPS_TOKEN_CACHE_SECONDS (keyed by its digest: the raw value is not kept): a call then
verifies it without a query. Revoking drops it from the revoking process's cache at once;
another process refuses it once its entry is older than that period.
"""

from __future__ import annotations

import time

from django.db import transaction

from idemops.conf import conf
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
    """The live token for a raw bearer value, or None."""
    token = cached_token(raw_token)
    if token is not None:
        return token
    read_at = time.monotonic()
    token = secrets.find(ApiToken.objects.select_related("tenant"), raw_token, TOKEN_PREFIX)
    if token is not None and conf().token_cache_seconds > 0:
        _verified[token.digest] = (token, read_at)
    return token
