"""Passkeys (WebAuthn, django-otp-webauthn): a second-factor device like the authenticator.

A registered passkey is a django-otp device (`WebAuthnCredential`): a session that used one carries it
as `user.otp_device`, so `access.authorize` and step-up treat it exactly like a TOTP code's device
(tools_app/access/second_factor.py); nothing here decides what a session may do.

`AuditedPasskeys` is the package's helper (OTP_WEBAUTHN_HELPER_CLASS) with each registration and each
use audited in the same transaction as the row it writes. The console's views (tools_app/admin/passkeys.py)
say who may register (`second_factor.may_enrol`) and mark the session verified.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django_otp_webauthn.helpers import WebAuthnHelper
from django_otp_webauthn.models import WebAuthnCredential

from tools_app.core import audit

KIND = "passkey"


class AuditedPasskeys(WebAuthnHelper):  # type: ignore[misc]  # the package ships no types
    def register_complete(self, user: Any, state: dict[str, Any], data: dict[str, Any]) -> Any:
        with transaction.atomic():
            device = super().register_complete(user=user, state=state, data=data)
            audit.record_event(action="second_factor.enrolled", obj=user, actor=audit.user_actor(user),
                               tenant_id=None, after={"user": user.get_username(), "device": KIND})
        return device

    def authenticate_complete(self, user: Any, state: dict[str, Any], data: dict[str, Any]) -> Any:
        with transaction.atomic():
            device = super().authenticate_complete(user=user, state=state, data=data)
            audit.record_event(action="second_factor.verified", obj=device.user,
                               actor=audit.user_actor(device.user), tenant_id=None,
                               after={"user": device.user.get_username(), "device": KIND})
        return device


def passkeys_of(user: Any) -> int:
    """How many passkeys `user` registered."""
    return WebAuthnCredential.objects.filter(user_id=user.pk, confirmed=True).count() if user.is_authenticated else 0


def audit_refused(user: Any, reason: str) -> None:
    """A passkey assertion or registration of `user`'s session was refused (`reason`: the package's code)."""
    with transaction.atomic():
        audit.record_event(action="second_factor.passkey_refused", obj=user, actor=audit.user_actor(user),
                           tenant_id=None, after={"user": user.get_username(), "reason": reason[:100]})
