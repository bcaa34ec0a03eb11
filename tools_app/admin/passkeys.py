"""The passkey ceremonies' endpoints, for the console's second-factor page (django-otp-webauthn's views).

Registering needs what enrolling an authenticator needs (`second_factor.may_enrol`: a verified session,
or a person with no device yet); a person's first device also brings their recovery codes, shown once.
A passkey's assertion marks the session verified and fresh (`second_factor.remember`), exactly as a
valid code does; a refused one is audited and leaves the session as it was.

Mounted under the package's URL names (`otp_webauthn:…`, which its template tags reverse), each view
behind the console's login (`admin_view`). Passwordless logins are off: a passkey follows a password.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin
from django.http import HttpResponse, JsonResponse
from django.urls import path, reverse
from django.views.i18n import JavaScriptCatalog
from django_otp_webauthn import exceptions
from django_otp_webauthn.models import WebAuthnCredential
from django_otp_webauthn.views import (
    BeginCredentialAuthenticationView,
    BeginCredentialRegistrationView,
    CompleteCredentialAuthenticationView,
    CompleteCredentialRegistrationView,
)

from tools_app.access import passkeys, second_factor
from tools_app.core import audit


class _MayRegister:
    request: Any

    def check_can_register(self) -> None:
        if not second_factor.may_enrol(self.request.user):
            raise exceptions.NotVerified()


class BeginRegistration(_MayRegister, BeginCredentialRegistrationView):  # type: ignore[misc]  # untyped package
    pass


class CompleteRegistration(_MayRegister, CompleteCredentialRegistrationView):  # type: ignore[misc]  # untyped
    def post(self, *args: Any, **kwargs: Any) -> HttpResponse:
        user = self.request.user
        first = not second_factor.has_device(user)
        response = super().post(*args, **kwargs)  # raises (answered by handle_exception) when refused
        device = WebAuthnCredential.objects.get(pk=json.loads(response.content)["id"])
        body: dict[str, Any] = {"id": device.pk}
        if first:  # the person's first device: verified now, with recovery codes as the authenticator gives
            second_factor.remember(self.request, device)
            body["recovery_codes"] = second_factor.recovery_codes(user, actor=audit.user_actor(user))
        return JsonResponse(body)

    def handle_exception(self, exc: Exception) -> HttpResponse:
        if isinstance(exc, exceptions.OTPWebAuthnApiError) and self.request.user.is_authenticated:
            passkeys.audit_refused(self.request.user, f"registration: {exc.code}")
        return super().handle_exception(exc)  # type: ignore[no-any-return]  # untyped package


class BeginVerification(BeginCredentialAuthenticationView):  # type: ignore[misc]  # untyped package
    pass


class CompleteVerification(CompleteCredentialAuthenticationView):  # type: ignore[misc]  # untyped package
    def complete_auth(self, device: Any) -> None:
        second_factor.remember(self.request, device)

    def get_success_url(self) -> str:
        return self.get_redirect_url() or reverse("admin:index")

    def handle_exception(self, exc: Exception) -> HttpResponse:
        if isinstance(exc, exceptions.OTPWebAuthnApiError) and self.request.user.is_authenticated:
            passkeys.audit_refused(self.request.user, exc.code)
        return super().handle_exception(exc)  # type: ignore[no-any-return]  # untyped package


def urlpatterns() -> list[Any]:
    site = admin.site
    return [
        path("registration/begin/", site.admin_view(BeginRegistration.as_view()),
             name="credential-registration-begin"),
        path("registration/complete/", site.admin_view(CompleteRegistration.as_view()),
             name="credential-registration-complete"),
        path("authentication/begin/", site.admin_view(BeginVerification.as_view()),
             name="credential-authentication-begin"),
        path("authentication/complete/", site.admin_view(CompleteVerification.as_view()),
             name="credential-authentication-complete"),
        path("jsi18n/", JavaScriptCatalog.as_view(packages=["django_otp_webauthn"]), name="js-i18n-catalog"),
    ]
