"""django-oauth-toolkit's validator with every token it issues (by code or by refresh) or revokes audited.

Named in settings (OAUTH2_PROVIDER's OAUTH2_VALIDATOR_CLASS) and imported only once the models are
loaded: django-oauth-toolkit's validators module reads its models when it is imported.
"""

from __future__ import annotations

import hashlib
from typing import Any

from django.db import transaction
from oauth2_provider.models import AccessToken, RefreshToken
from oauth2_provider.oauth2_validators import OAuth2Validator

from tools_app.access.oauth import connection_of
from tools_app.core import audit


class AuditedValidator(OAuth2Validator):  # type: ignore[misc]  # django-oauth-toolkit ships no types
    """django-oauth-toolkit's validator; every token it issues (by code or by refresh) or revokes is an
    audit event, in the transaction that writes it, on the connection's tenant."""

    def _save_bearer_token(self, token: dict[str, Any], request: Any, *args: Any, **kwargs: Any) -> Any:
        saved = super()._save_bearer_token(token, request, *args, **kwargs)
        checksum = hashlib.sha256(token["access_token"].encode()).hexdigest()
        row = AccessToken.objects.select_related("application").get(token_checksum=checksum)
        connection = connection_of(row.user_id, row.application_id)
        refreshed = request.grant_type == "refresh_token"
        audit.record_event(
            action="oauth.token_refreshed" if refreshed else "oauth.token_issued", obj=row,
            actor=f"oauth-client:{row.application.client_id}"[:200],
            tenant_id=connection.tenant_id if connection is not None else None,
            after={"scopes": row.scope, "resource": row.resource, "expires": row.expires.isoformat(),
                   "user_id": row.user_id, "connection": connection.pk if connection is not None else None})
        return saved

    def revoke_token(self, token: str, token_type_hint: str | None, request: Any, *args: Any, **kwargs: Any) -> None:
        checksum = hashlib.sha256(token.encode()).hexdigest()
        application_id = getattr(request.client, "pk", None)
        found = (AccessToken.objects.filter(token_checksum=checksum, application_id=application_id).first()
                 or RefreshToken.objects.filter(token_checksum=checksum, application_id=application_id).first())
        with transaction.atomic():
            super().revoke_token(token, token_type_hint, request, *args, **kwargs)
            if found is not None and application_id is not None:
                connection = connection_of(found.user_id, application_id)
                audit.record_event(action="oauth.token_revoked", obj=found,
                                   actor=f"oauth-client:{request.client.client_id}"[:200],
                                   tenant_id=connection.tenant_id if connection is not None else None,
                                   after={"kind": type(found).__name__, "user_id": found.user_id})
