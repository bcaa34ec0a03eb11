"""The platform's URLs, and each installed app's own (`<app>.idemops_urls`, found like `idemops_tools`)."""

from django.apps import apps
from django.contrib import admin
from django.urls import include, path
from django.utils.module_loading import module_has_submodule
from oauth2_provider import views as oauth_views

from tools_app.admin import passkeys
from tools_app.admin.consent import ConsentView
from tools_app.web.confirmations import confirmation_page
from tools_app.web.health import livez, readyz
from tools_app.web.metrics import metrics

# Agents' OAuth 2.1 (docs/auth.md): django-oauth-toolkit's endpoints under its URL names (its views
# reverse them), the consent page in the console's look, the metadata documents at the server's root.
oauth_patterns = [
    path(".well-known/oauth-authorization-server", oauth_views.OAuthServerMetadataView.as_view(),
         name="oauth-server-metadata"),
    # RFC 9728: the document /mcp's 401 names (path-suffixed), and the root form.
    path(".well-known/oauth-protected-resource", oauth_views.OAuthProtectedResourceMetadataView.as_view(),
         name="oauth-resource-metadata"),
    path(".well-known/oauth-protected-resource/<path:resource_path>",
         oauth_views.OAuthProtectedResourceMetadataView.as_view(), name="oauth-resource-metadata-path"),
    path("oauth/authorize/", ConsentView.as_view(), name="authorize"),
    path("oauth/token/", oauth_views.TokenView.as_view(), name="token"),
    path("oauth/revoke/", oauth_views.RevokeTokenView.as_view(), name="revoke-token"),
    path("oauth/register/", oauth_views.DynamicClientRegistrationView.as_view(), name="dcr-register"),
    # RFC 7592: a registered client reads, updates or deletes its registration with its registration token.
    path("oauth/register/<str:client_id>/", oauth_views.DynamicClientRegistrationManagementView.as_view(),
         name="dcr-register-management"),
]

urlpatterns = [
    # People's passkeys (docs/auth.md): the ceremonies the console's second-factor page calls.
    path("admin/second-factor/passkey/", include((passkeys.urlpatterns(), "otp_webauthn"))),
    path("admin/", admin.site.urls),
    path("confirmations/<uuid:token>/", confirmation_page, name="confirmation"),
    path("livez", livez, name="livez"),
    path("readyz", readyz, name="readyz"),
    path("healthz", readyz, name="healthz"),  # /readyz's name before the two probes
    path("metrics", metrics, name="metrics"),
    path("api/", include("tools_app.api.urls")),
    path("", include((oauth_patterns, "oauth2_provider"))),
]

# An app's own endpoints (the demo's payment-gateway callback): its `idemops_urls` module, at the root.
urlpatterns += [path("", include(f"{config.name}.idemops_urls")) for config in apps.get_app_configs()
                if config.module is not None and module_has_submodule(config.module, "idemops_urls")]
