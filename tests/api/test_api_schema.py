"""The OpenAPI schema at /api/schema/ and the docs pages, served without any CDN."""

import re

import pytest

from tools_app.api.urls import router

pytestmark = pytest.mark.django_db


@pytest.fixture
def schema(client):
    response = client.get("/api/schema/", {"format": "json"})
    assert response.status_code == 200
    return response.json()


def test_every_registered_endpoint_is_in_the_schema(schema):
    prefixes = [prefix for prefix, _, _ in router.registry]

    for prefix in prefixes:
        assert f"/api/v1/{prefix}" in schema["paths"]
        assert f"/api/v1/{prefix}/{{id}}" in schema["paths"]
        assert f"/api/v1/{prefix}/export.csv" in schema["paths"]
    assert all(path.startswith("/api/v1/") for path in schema["paths"])


def test_every_operation_is_read_only_and_described(schema):
    for path, operations in schema["paths"].items():
        assert set(operations) == {"get"}, path
        operation = operations["get"]
        assert operation.get("description") or operation.get("summary"), path
        assert {"401", "403", "404"} <= set(operation["responses"]), path
        assert operation["security"] == [{"auditorKey": []}, {"cookieAuth": []}]


def test_every_filter_and_parameter_is_described(schema):
    for path, operations in schema["paths"].items():
        for parameter in operations["get"].get("parameters", []):
            assert parameter.get("description"), f"{path} {parameter['name']}"


def test_the_list_and_its_export_take_the_same_filters(schema):
    for prefix, _, _ in router.registry:
        listed = {p["name"] for p in schema["paths"][f"/api/v1/{prefix}"]["get"]["parameters"]}
        exported = {p["name"] for p in schema["paths"][f"/api/v1/{prefix}/export.csv"]["get"]["parameters"]}
        assert listed - {"cursor", "page_size"} == exported


def test_the_records_filters_are_the_ones_auditors_need(schema):
    names = {p["name"] for p in schema["paths"]["/api/v1/idempotency-records"]["get"]["parameters"]}

    assert {"tenant", "tool", "status", "error_class", "actor", "created_after", "created_before", "finished_after",
            "finished_before", "ordering", "cursor", "page_size", "key_digest"} <= names


def test_the_schema_never_offers_the_raw_key_arguments_or_result(schema):
    record = schema["components"]["schemas"]["IdempotencyRecord"]["properties"]

    assert "key_digest" in record
    assert not {"key", "arguments", "result", "lease_owner", "field_digests"} & set(record)
    # the error message only in its redacted form (tools_app.redaction.failure_text)
    assert "[withheld]" in record["error_message"]["description"]


@pytest.mark.parametrize("page", ["/api/docs/", "/api/redoc/"])
def test_the_docs_pages_load_their_assets_from_this_server(client, page):
    response = client.get(page)

    assert response.status_code == 200
    html = response.content.decode()
    assets = re.findall(r'(?:src|href)="([^"]+\.(?:js|css|png))"', html)
    assert assets, html
    for asset in assets:
        assert asset.startswith("/static/drf_spectacular_sidecar/"), asset
        assert client.get(asset).status_code == 200, asset
    assert "/api/schema/" in html
