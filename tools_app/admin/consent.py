"""The consent page an MCP host sends its person to (served at /oauth/authorize/, idemops/urls.py).

django-oauth-toolkit's authorization view, in the console's look, with two choices more: the tenant the
agent acts on and the scopes it gets (at most those it asked for). Consenting is `access.oauth.connect`,
behind `authorize` like every operator operation: a session that entered no second-factor code is sent
to the second-factor page first, and a crafted POST from one is refused (403, audited). Not imported by
the admin package: django-oauth-toolkit's views need the models loaded.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from oauth2_provider.forms import AllowForm
from oauth2_provider.models import get_application_model
from oauth2_provider.views import AuthorizationView

from tools_app import access
from tools_app.access import oauth, second_factor
from tools_app.access.authorization import SECOND_FACTOR_REFUSAL
from tools_app.access.models import AgentConnection, Tenant
from tools_app.admin.operator_actions import second_factor_page
from tools_app.core import audit
from tools_app.core.errors import PermissionDenied


class ConsentForm(AllowForm):  # type: ignore[misc]  # django-oauth-toolkit ships no types
    tenant = forms.ModelChoiceField(queryset=Tenant.objects.none(), required=False,
                                    help_text="The tenant whose tools the agent calls, for you.")
    granted = forms.MultipleChoiceField(label="Scopes", required=False, widget=forms.CheckboxSelectMultiple,
                                        choices=[(name, f"{name}: {text}") for name, text in oauth.SCOPES.items()])

    def __init__(self, *args: Any, user: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        tenants = access.scope(Tenant.objects.all(), user, "id")
        self.fields["tenant"].queryset = tenants
        if tenants.count() == 1:
            self.fields["tenant"].initial = tenants.get()
        self.fields["granted"].initial = (self.initial.get("scope") or "").split()


class ConsentView(AuthorizationView):  # type: ignore[misc]  # django-oauth-toolkit ships no types
    """GET: what the client asks (its name, the scopes, the resource); POST: the person's answer."""

    template_name = "oauth2_provider/authorize.html"
    form_class = ConsentForm

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        method = (request.GET if request.method == "GET" else request.POST).get("code_challenge_method")
        if method != "S256":  # OAuth 2.1: PKCE, with S256 only; refused before anyone is asked anything
            return render(request, self.template_name, {"error": {
                "error": "invalid_request", "description": "PKCE with code_challenge_method=S256 is required"}},
                status=400)
        if request.user.is_authenticated and not second_factor.verified(request.user):
            if request.method == "POST":  # a crafted POST: refused and audited, as authorize would
                access.audit_refusal(oauth.CONNECT, AgentConnection, audit.user_actor(request.user),
                                     SECOND_FACTOR_REFUSAL)
                raise DjangoPermissionDenied(SECOND_FACTOR_REFUSAL)
            return HttpResponseRedirect(second_factor_page(request.get_full_path()))
        response: HttpResponse = super().dispatch(request, *args, **kwargs)
        return response

    def get_form_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = super().get_form_kwargs()
        kwargs["user"] = self.request.user
        return kwargs

    def form_valid(self, form: ConsentForm) -> HttpResponse:
        if form.cleaned_data.get("allow"):
            requested = (form.cleaned_data.get("scope") or "").split()
            granted = [name for name in form.cleaned_data.get("granted") or [] if name in requested]
            tenant = form.cleaned_data.get("tenant")
            if tenant is None or not granted:
                form.add_error(None, "Choose the tenant and at least one scope (or cancel).")
                invalid: HttpResponse = self.form_invalid(form)  # Django's FormView, through an untyped base
                return invalid
            application = get_application_model().objects.get(client_id=form.cleaned_data["client_id"])
            assert isinstance(self.request.user, User)  # LoginRequiredMixin let only a signed-in person here
            try:
                oauth.connect(self.request.user, application, tenant, granted)
            except PermissionDenied as refused:  # audited by authorize
                raise DjangoPermissionDenied(refused.message) from None
            form.cleaned_data["scope"] = " ".join(granted)
        response: HttpResponse = super().form_valid(form)  # django-oauth-toolkit's, untyped
        return response
