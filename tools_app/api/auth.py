"""Who may call the auditors' API: an auditor key, or a user with the auditor permission."""

from __future__ import annotations

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.permissions import BasePermission

from tools_app.access import auditors

REALM = "idemops-audit"


class AuditorKeyAuthentication(BaseAuthentication):
    """`Authorization: Bearer ida_...`. Listed first, so a request without
    credentials is answered 401 with a `WWW-Authenticate` challenge."""

    def authenticate(self, request):
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

    def authenticate_header(self, request):
        return f'Bearer realm="{REALM}"'


class IsAuditor(BasePermission):
    message = "this account may not use the auditors' API: it needs the tools_app.use_auditor_api permission"

    def has_permission(self, request, view):
        return auditors.may_use_api(request.user)


class AuditorKeyScheme(OpenApiAuthenticationExtension):
    target_class = AuditorKeyAuthentication
    name = "auditorKey"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "An auditor key (`ida_...`), issued with `manage.py issue_auditor_key` or in the "
                           "admin and shown once. It reads only the tenants granted to it.",
        }
