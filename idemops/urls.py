"""The platform's URLs, and each installed app's own (`<app>.idemops_urls`, found like `idemops_tools`)."""

from django.apps import apps
from django.contrib import admin
from django.urls import include, path
from django.utils.module_loading import module_has_submodule

from tools_app.web.health import livez, readyz
from tools_app.web.metrics import metrics

urlpatterns = [
    path("admin/", admin.site.urls),
    path("livez", livez, name="livez"),
    path("readyz", readyz, name="readyz"),
    path("healthz", readyz, name="healthz"),  # /readyz's name before the two probes
    path("metrics", metrics, name="metrics"),
    path("api/", include("tools_app.api.urls")),
]

# An app's own endpoints (the demo's payment-gateway callback): its `idemops_urls` module, at the root.
urlpatterns += [path("", include(f"{config.name}.idemops_urls")) for config in apps.get_app_configs()
                if config.module is not None and module_has_submodule(config.module, "idemops_urls")]
