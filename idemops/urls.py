from django.contrib import admin
from django.urls import include, path

from tools_app.web.callbacks import payment_gateway_callback
from tools_app.web.health import livez, readyz
from tools_app.web.metrics import metrics

urlpatterns = [
    path("admin/", admin.site.urls),
    path("livez", livez, name="livez"),
    path("readyz", readyz, name="readyz"),
    path("healthz", readyz, name="healthz"),  # /readyz's name before the two probes
    path("metrics", metrics, name="metrics"),
    path("api/", include("tools_app.api.urls")),
    path("callbacks/payment-gateway", payment_gateway_callback, name="payment-gateway-callback"),
]
