"""Who may call the auditors' API: an auditor key, or a user with the auditor permission."""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.views import APIView

from tools_app.access import auditors
from tools_app.access.auditors import KeyAuditor
from tools_app.access.models import AuditorKey

REALM = "idemops-audit"


class AuditorKeyAuthentication(BaseAuthentication):
    """`Authorization: Bearer ida_...`. Listed first, so a request without
    credentials is answered 401 with a `WWW-Authenticate` challenge."""

    def authenticate(self, request: Request) -> tuple[KeyAuditor, AuditorKey] | None:
        parts = get_authorization_header(request).split()
        if not parts or parts[0].lower() != b"bearer":
            return None
        if len(parts) != 2:
            raise AuthenticationFailed("malformed Authorization header: expected 'Bearer <auditor key>'")
        try:
            raw_key = parts[1].decode("ascii")
        except UnicodeDecodeError:
            raise AuthenticationFailed("unknown or revoked auditor key") from None
        auditor = auditors.authenticate_key(raw_key)
        if auditor is None:
            raise AuthenticationFailed("unknown or revoked auditor key")
        return auditor, auditor.key

    def authenticate_header(self, request: Request) -> str:
        return f'Bearer realm="{REALM}"'


class IsAuditor(BasePermission):
    message = "this account may not use the auditors' API: it needs the tools_app.use_auditor_api permission"

    def has_permission(self, request: Request, view: APIView) -> bool:
        return auditors.may_use_api(request.user)


# drf-spectacular's extension base registers subclasses in an unannotated __init_subclass__.
class AuditorKeyScheme(OpenApiAuthenticationExtension):  # type: ignore[no-untyped-call]
    target_class = AuditorKeyAuthentication
    name = "auditorKey"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "An auditor key (`ida_...`), issued with `manage.py issue_auditor_key` or in the "
                           "admin and shown once. It reads only the tenants granted to it.",
        }
