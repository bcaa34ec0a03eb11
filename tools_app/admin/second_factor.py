"""The console's side of the second factor: the login form's code, and the page that enrols an
authenticator or a passkey, or takes a code or a passkey (also again, when a step-up asks for a fresh one).
The passkey ceremonies' endpoints are tools_app/admin/passkeys.py.

The rule itself is not here: `access.authorize` refuses every operator operation to a session that
entered no code, and approvals ask for a fresh one above a tenant's step-up amount
(tools_app.access.second_factor). These views only let a person prove it.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.conf import settings
from django.contrib.admin import AdminSite
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme

from tools_app.access import passkeys, second_factor
from tools_app.conf import conf
from tools_app.core import audit

CODE_HELP = ("From your authenticator app (or a recovery code); with a passkey, leave it empty: it is asked for "
             "next. Without either you may look, not change anything.")


class ConsoleLoginForm(AdminAuthenticationForm):
    """Django's admin login, plus the authenticator code; a wrong code refuses the login."""

    otp_token = forms.CharField(label="Authenticator code", required=False, help_text=CODE_HELP,
                                widget=forms.TextInput(attrs={"autocomplete": "one-time-code",
                                                              "inputmode": "numeric"}))

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        user = self.get_user()
        code = cleaned.get("otp_token") or ""
        if user is not None and code:
            device = second_factor.check_code(user, code)
            if device is None:
                second_factor.audit_failed_code(user)
                raise ValidationError("That authenticator code is not valid (or was used already).",
                                      code="invalid_otp")
            # django-otp keeps it in the session at login (its user_logged_in receiver); we note when.
            user.otp_device = device  # type: ignore[attr-defined]  # django-otp's attribute
        return cleaned


class CodeForm(forms.Form):
    code = forms.CharField(label="Code", max_length=32, widget=forms.TextInput(attrs={
        "autocomplete": "one-time-code", "inputmode": "numeric", "autofocus": True}))


def second_factor_view(site: AdminSite) -> Any:
    def view(request: HttpRequest) -> HttpResponse:
        user = request.user
        assert isinstance(user, User)  # admin_view lets only signed-in staff here
        next_url = request.POST.get("next") or request.GET.get("next") or reverse("admin:index")
        if not url_has_allowed_host_and_scheme(next_url, allowed_hosts={request.get_host()},
                                               require_https=request.is_secure()):
            next_url = reverse("admin:index")
        device = second_factor.totp_device(user)
        # A person with a passkey only adds an authenticator from a verified session, like a passkey.
        enrolling = device is None and second_factor.may_enrol(user)
        if enrolling:  # an unconfirmed authenticator, kept until its first code confirms it
            device = second_factor.totp_device(user, confirmed=False) or second_factor.enrol(
                user, actor=audit.user_actor(user), confirmed=False)
        form = CodeForm(request.POST or None)
        context: dict[str, Any] = {**site.each_context(request), "title": "Second factor", "form": form,
                                   "next": next_url, "enrolling": enrolling,
                                   "stale": request.GET.get("stale") == "1",
                                   "step_up_minutes": f"{conf().step_up_minutes:g}",
                                   "verified_at": second_factor.verified_at(user),
                                   "passkeys": passkeys.passkeys_of(user),
                                   "may_register_passkey": second_factor.may_enrol(user),
                                   "passkey_origin": next(iter(settings.OTP_WEBAUTHN_ALLOWED_ORIGINS), "")}
        if enrolling:
            assert device is not None
            context.update(secret=second_factor.base32_secret(device), otpauth_uri=device.config_url)
        if request.method == "POST" and form.is_valid():
            code = form.cleaned_data["code"]
            if enrolling and device is not None and device.verify_token("".join(code.split())):
                context["recovery_codes"] = second_factor.confirm(device, actor=audit.user_actor(user))
                second_factor.remember(request, device)
                return TemplateResponse(request, "admin/tools_app/second_factor.html", context)
            verified = None if enrolling else second_factor.check_code(user, code)
            if verified is not None:
                second_factor.remember(request, verified)
                return HttpResponseRedirect(next_url)
            second_factor.audit_failed_code(user)
            form.add_error("code", "That code is not valid (or was used already).")
        return TemplateResponse(request, "admin/tools_app/second_factor.html", context)

    return view
