"""An auditor sees the tenants granted to it and nothing else, in every endpoint, filter and export."""

import pytest
from django.contrib.auth.models import Group, User

from tests.support.api_support import ENDPOINTS, csv_rows, ids, key_client, make_row, pk_of
from tools_app.access import auditors
from tools_app.models import TenantAccess

pytestmark = pytest.mark.django_db


@pytest.fixture
def rows(tenant, other_tenant):
    """Three rows of acme's and three of globex's, in each endpoint."""
    return {endpoint: {slug: [pk_of(make_row(endpoint, t)) for _ in range(3)]
                       for slug, t in (("acme", tenant), ("globex", other_tenant))}
            for endpoint in ENDPOINTS}


def session_auditor(*tenants, superuser=False):
    user = User.objects.create_user(f"auditor{User.objects.count()}", password="pw", is_superuser=superuser)
    user.groups.add(Group.objects.get(name=auditors.GROUP_NAME))
    for tenant in tenants:
        TenantAccess.objects.create(user=user, tenant=tenant)
    from rest_framework.test import APIClient

    client = APIClient()
    client.force_login(user)
    return client


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_an_auditor_of_acme_lists_only_acme_rows(endpoint, tenant, rows):
    client = key_client(tenant)

    response = client.get(f"/api/v1/{endpoint}", {"page_size": 1000})

    assert response.status_code == 200
    assert set(ids(response)) >= set(rows[endpoint]["acme"])
    assert not set(ids(response)) & set(rows[endpoint]["globex"])
    assert {row["tenant"] for row in response.json()["results"]} == {"acme"}


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_filtering_by_another_tenant_returns_no_rows(endpoint, tenant, rows):
    client = key_client(tenant)

    response = client.get(f"/api/v1/{endpoint}", {"tenant": "globex"})

    assert response.status_code == 200
    assert response.json()["results"] == []


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_another_tenants_row_is_not_found_not_forbidden(endpoint, tenant, rows):
    client = key_client(tenant)

    for pk in rows[endpoint]["globex"]:
        response = client.get(f"/api/v1/{endpoint}/{pk}")
        assert response.status_code == 404
    assert client.get(f"/api/v1/{endpoint}/{rows[endpoint]['acme'][0]}").status_code == 200


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_the_csv_export_holds_no_row_of_another_tenant(endpoint, tenant, rows):
    client = key_client(tenant)

    for params in ({}, {"tenant": "globex"}, {"tenant": "acme"}):
        exported = csv_rows(client.get(f"/api/v1/{endpoint}/export.csv", params))
        assert {row["tenant"] for row in exported} <= {"acme"}
        assert not {row["id"] for row in exported} & {str(pk) for pk in rows[endpoint]["globex"]}
    exported_ids = {r["id"] for r in csv_rows(client.get(f"/api/v1/{endpoint}/export.csv"))}
    assert exported_ids >= {str(pk) for pk in rows[endpoint]["acme"]}


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_a_key_granted_two_tenants_sees_both(endpoint, tenant, other_tenant, rows):
    client = key_client(tenant, other_tenant)

    response = client.get(f"/api/v1/{endpoint}", {"page_size": 1000})

    assert set(ids(response)) >= set(rows[endpoint]["acme"]) | set(rows[endpoint]["globex"])


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_a_key_granted_no_tenant_sees_nothing(endpoint, rows):
    client = key_client()

    assert client.get(f"/api/v1/{endpoint}").json()["results"] == []
    assert csv_rows(client.get(f"/api/v1/{endpoint}/export.csv")) == []


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_a_session_auditor_is_scoped_by_tenant_access(endpoint, tenant, rows):
    client = session_auditor(tenant)

    listed = ids(client.get(f"/api/v1/{endpoint}", {"page_size": 1000}))

    assert set(listed) >= set(rows[endpoint]["acme"])
    assert not set(listed) & set(rows[endpoint]["globex"])
    assert client.get(f"/api/v1/{endpoint}/{rows[endpoint]['globex'][0]}").status_code == 404


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_a_superuser_sees_every_tenant(endpoint, rows):
    client = session_auditor(superuser=True)

    listed = ids(client.get(f"/api/v1/{endpoint}", {"page_size": 1000}))

    assert set(listed) >= set(rows[endpoint]["acme"]) | set(rows[endpoint]["globex"])


def test_a_revoked_grant_takes_effect_on_the_next_request(tenant, other_tenant, rows):
    client = key_client(tenant, other_tenant, name="firm")
    key = auditors.authenticate_key(client.raw_key).key

    auditors.set_tenants(key, [tenant], actor="user:admin")

    listed = ids(client.get("/api/v1/idempotency-records", {"page_size": 1000}))
    assert set(listed) >= set(rows["idempotency-records"]["acme"])  # still granted
    assert not set(listed) & set(rows["idempotency-records"]["globex"])


def test_a_session_auditor_can_browse_the_api_in_html(tenant, rows):
    client = session_auditor(tenant)

    response = client.get("/api/v1/idempotency-records", HTTP_ACCEPT="text/html")

    assert response.status_code == 200 and response["Content-Type"].startswith("text/html")
    assert "globex" not in response.content.decode()
