"""Agents by OAuth 2.1: a person consents that an MCP host acts for them on one tenant; its access
tokens then authenticate at /mcp beside the static API tokens.

The authorization server is django-oauth-toolkit (authorization code with PKCE S256 only, refresh
tokens rotated, revocation, RFC 8414 and RFC 9728 metadata, RFC 8707 resource indicators, dynamic
registration; settings in idemops/settings.py). This module holds what is ours:

- `connect`: the consent (AgentConnection), behind `authorize` like every operator operation, so a
  session without a second factor cannot consent; audited.
- `revoke`: a person (or a superuser) ends a connection: every token of that client for them goes.
- `authenticate`: an access token at /mcp -> the token and its connection (tenant), or None.
- `oauth_validator.AuditedValidator`: django-oauth-toolkit's validator, auditing each issued, refreshed and
  revoked token (its own module: django-oauth-toolkit's validators module needs the models loaded).

A token belongs to the person who consented (AccessToken.user): its agent's identity names the
connection, and `owner_id_of` (tokens.py) finds that person, so four eyes holds for OAuth agents too.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any

import httpx2
from django.db import transaction
from django.utils import timezone
from oauth2_provider.models import AccessToken, Application, RefreshToken

from tools_app.access.authorization import Permit, authorize
from tools_app.access.limits import admit_per_hour
from tools_app.access.models import AgentConnection, Tenant
from tools_app.conf import conf
from tools_app.core import audit, db, url_allowlist
from tools_app.core.errors import InvalidInput, Transient

if TYPE_CHECKING:
    from django.contrib.auth.models import User

READ, WRITE, LONG = "read", "write", "long"
SCOPES = {READ: "call read-only tools", WRITE: "call tools that change something",
          LONG: "start and control long tasks"}

CONNECT = Permit("tools_app.connect_agent", "connect_agent", "connect an agent (OAuth client) to a tenant",
                 "oauth.consent_refused")


def connect(user: User, application: Application, tenant: Tenant, scopes: list[str]) -> AgentConnection:
    """`user` consents that `application` acts for them on `tenant` with `scopes` (a new connection, or the
    client's existing one for them, now on this tenant with these scopes). Refused without the permission,
    the tenant or a verified second factor (authorize), audited either way."""
    connection = AgentConnection.objects.filter(user=user, application=application).first() or AgentConnection(
        user=user, application=application)
    before = None if connection.pk is None else {"tenant": connection.tenant_id, "scopes": connection.scopes,
                                                 "revoked": connection.revoked_at is not None}
    connection.tenant = tenant
    actor = authorize(user, CONNECT, connection)
    with transaction.atomic():
        if before is not None and (before["tenant"] != tenant.pk or before["scopes"] != " ".join(sorted(set(scopes)))):
            # The client's earlier tokens were for another tenant or other scopes: they end here.
            _end_tokens(connection)
        connection.scopes = " ".join(sorted(set(scopes)))
        connection.revoked_at = None
        connection.save()
        audit.record_event(action="oauth.consented", obj=connection, actor=actor, before=before,
                           after={"client": application.name or application.client_id, "tenant": tenant.slug,
                                  "scopes": connection.scopes, "user": user.get_username()})
    return connection


def revoke(connection: AgentConnection, *, actor: str, reason: str = "") -> bool:
    """End the connection: every access and refresh token of its client for its person stops working.
    False: it was revoked already."""
    with transaction.atomic():
        if not db.transition(connection, {"revoked_at": None}, {"revoked_at": timezone.now()},
                             action="oauth.revoked", actor=actor, reason=reason,
                             after={"client": connection.application.name or connection.application.client_id}):
            return False
        _end_tokens(connection)
    return True


def _end_tokens(connection: AgentConnection) -> None:
    """Every access and refresh token of the connection's client for its person stops working."""
    RefreshToken.objects.filter(user_id=connection.user_id, application_id=connection.application_id,
                                revoked__isnull=True).update(revoked=timezone.now())
    AccessToken.objects.filter(user_id=connection.user_id, application_id=connection.application_id).delete()


def may_revoke(user: Any, connection: AgentConnection) -> bool:
    """A person ends their own connections; a superuser anyone's."""
    return bool(user.is_superuser or connection.user_id == user.pk)


def authenticate(raw_token: str) -> tuple[AccessToken, AgentConnection] | None:
    """The live access token for a raw bearer value and its live connection (with its tenant and limits),
    or None: unknown, expired, or its connection revoked."""
    checksum = hashlib.sha256(raw_token.encode()).hexdigest()
    token = AccessToken.objects.select_related("application").filter(token_checksum=checksum).first()
    if token is None or token.is_expired() or token.user_id is None:
        return None
    connection = AgentConnection.objects.select_related("tenant", "tenant__limits").filter(
        user_id=token.user_id, application_id=token.application_id, revoked_at__isnull=True).first()
    if connection is None:
        return None
    return token, connection


def connection_of(user_id: int | None, application_id: int | None) -> AgentConnection | None:
    if user_id is None or application_id is None:
        return None
    return AgentConnection.objects.filter(user_id=user_id, application_id=application_id).first()


class RegistrationLimit:
    """Who may register a client dynamically (RFC 7591): anyone, as MCP hosts do, but only
    IDEMOPS_OAUTH_REGISTRATIONS_PER_HOUR from one address (the calls' token buckets; over it: refused)."""

    def has_permission(self, request: Any) -> bool:
        address = request.META.get("REMOTE_ADDR", "")
        return admit_per_hour(f"oauth-registration:{address}", conf().oauth_registrations_per_hour)


class AllowListedMetadataFetcher:
    """Fetches a client's metadata document (Client ID Metadata Documents) through the platform's outbound
    URL allow-list and SSRF guard (core.url_allowlist: IDEMOPS_OAUTH_CLIENT_METADATA_ALLOWED_PREFIXES, public
    addresses only, the checked address connected to, no redirects), bounded in size and time; django-oauth-
    toolkit caches what it returns for the document's max-age."""

    def fetch(self, client_id: str) -> tuple[dict[str, Any], int]:
        from oauth2_provider.cimd import CIMDError, _effective_max_age
        from oauth2_provider.settings import oauth2_settings

        try:
            target = url_allowlist.check(client_id, conf().oauth_client_metadata_allowed_prefixes,
                                         field="client_id")
        except (InvalidInput, Transient) as refused:
            raise CIMDError(refused.message) from None
        limit = oauth2_settings.CIMD_MAX_DOCUMENT_SIZE
        with httpx2.Client(timeout=oauth2_settings.CIMD_FETCH_TIMEOUT_SECONDS) as client:
            try:
                response = target.send(client, "GET", stream=True, headers={"Accept": "application/json"})
            except httpx2.HTTPError as failed:
                raise CIMDError(f"could not fetch the client's metadata document: {failed}") from None
            try:
                if response.status_code != 200:
                    raise CIMDError(f"the client's metadata document answered HTTP {response.status_code}")
                body = b""
                for chunk in response.iter_bytes():
                    body += chunk
                    if len(body) > limit:
                        raise CIMDError(f"the client's metadata document is larger than {limit} bytes")
            finally:
                response.close()
        try:
            document = json.loads(body)
        except ValueError:
            raise CIMDError("the client's metadata document is not JSON") from None
        if not isinstance(document, dict):
            raise CIMDError("the client's metadata document is not a JSON object")
        return document, _effective_max_age(response.headers.get("Cache-Control"))
