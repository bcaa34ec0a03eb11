from django.contrib import admin
from django.urls import path

from tools_app.health import healthz

urlpatterns = [
    path("admin/", admin.site.urls),
    path("healthz", healthz, name="healthz"),
]
