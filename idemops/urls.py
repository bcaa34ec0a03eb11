from django.contrib import admin
from django.urls import include, path

from tools_app.web.health import healthz
from tools_app.web.metrics import metrics

urlpatterns = [
    path("admin/", admin.site.urls),
    path("healthz", healthz, name="healthz"),
    path("metrics", metrics, name="metrics"),
    path("api/", include("tools_app.api.urls")),
]
