"""A new endpoint is one declaration: the base gives it auth, scoping, filters, pages, CSV and schema.

This module declares an endpoint the project does not ship (order lines,
whose tenant is reached through their order, like checkpoints through their
task) in its own URLconf, and checks that it behaves like the real ones.
"""

import django_filters
import pytest
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView
from rest_framework.routers import SimpleRouter

from idemops_demo.models import Order, OrderLine
from tests.support.api_support import csv_rows, key_client
from tools_app.api.endpoints import AuditorSerializer, AuditorViewSet, tenant_filter

# --- the declaration ------------------------------------------------------------


class OrderLineSerializer(AuditorSerializer):
    class Meta:
        model = OrderLine
        fields = ["id", "order", "sku", "quantity"]


class OrderLineFilter(django_filters.FilterSet):
    tenant = tenant_filter("order__tenant__slug")
    sku = django_filters.CharFilter(help_text="Stock keeping unit, exactly.")

    class Meta:
        model = OrderLine
        fields: list[str] = []


class OrderLineViewSet(AuditorViewSet):
    """Order lines (an example endpoint, for this test only)."""

    queryset = OrderLine.objects.all()
    serializer_class = OrderLineSerializer
    filterset_class = OrderLineFilter
    tenant_field = "order__tenant_id"
    ordering_fields = ["id"]
    ordering = ["id"]
    export_name = "order-lines"


router = SimpleRouter(trailing_slash="")
router.register("order-lines", OrderLineViewSet, basename="order-line")
v1 = [path("api/v1/", include(router.urls))]
urlpatterns = [*v1, path("api/schema/", SpectacularAPIView.as_view(patterns=v1))]

# --- what it gets ------------------------------------------------------------------

pytestmark = [pytest.mark.django_db, pytest.mark.urls(__name__)]


@pytest.fixture
def lines(tenant, other_tenant):
    def line(t, sku):
        order = Order.objects.create(tenant=t, customer="c", currency="EUR", total=1)
        return OrderLine.objects.create(order=order, sku=sku, quantity=1, unit_price=1).pk

    return {"acme": [line(tenant, "A-1"), line(tenant, "A-2")], "globex": [line(other_tenant, "A-1")]}


def test_a_declared_endpoint_is_scoped_through_a_relation(tenant, lines):
    client = key_client(tenant)

    listed = [row["id"] for row in client.get("/api/v1/order-lines").json()["results"]]

    assert listed == lines["acme"]
    assert client.get(f"/api/v1/order-lines/{lines['globex'][0]}").status_code == 404
    assert client.get("/api/v1/order-lines", {"sku": "A-1"}).json()["results"][0]["id"] == lines["acme"][0]


def test_a_declared_endpoint_exports_csv_with_its_serializer_columns(tenant, lines):
    response = key_client(tenant).get("/api/v1/order-lines/export.csv", {"tenant": "globex"})

    assert response.status_code == 200 and csv_rows(response) == []
    rows = csv_rows(key_client(tenant).get("/api/v1/order-lines/export.csv"))
    assert [list(row) for row in rows][0] == ["id", "order", "sku", "quantity"]
    assert [int(row["id"]) for row in rows] == lines["acme"]


def test_a_declared_endpoint_refuses_anonymous_callers_and_writes(tenant, lines):
    from rest_framework.test import APIClient

    assert APIClient().get("/api/v1/order-lines").status_code == 401
    assert key_client(tenant).delete(f"/api/v1/order-lines/{lines['acme'][0]}").status_code == 405


def test_a_declared_endpoint_is_in_the_schema_with_its_filters(client):
    schema = client.get("/api/schema/", {"format": "json"}).json()

    assert {"/api/v1/order-lines", "/api/v1/order-lines/{id}", "/api/v1/order-lines/export.csv"} <= set(
        schema["paths"])
    names = {p["name"] for p in schema["paths"]["/api/v1/order-lines"]["get"]["parameters"]}
    assert {"tenant", "sku", "ordering", "cursor", "page_size"} <= names
