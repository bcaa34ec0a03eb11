"""The demo's own endpoint: the payment gateway's signed callback (idemops_demo.callbacks)."""

from django.urls import path

from idemops_demo.callbacks import payment_gateway_callback

urlpatterns = [
    path("callbacks/payment-gateway", payment_gateway_callback, name="payment-gateway-callback"),
]
