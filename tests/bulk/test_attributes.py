"""Searchable business attributes: a tool's declared search fields are kept on its record (from the
arguments when claimed, from the result when it succeeds), and the auditors' API and the console's Find
find records by them."""

import pytest
from django.urls import reverse

from tests.support.api_support import ids, key_client
from tests.support.operators import make_operator
from tools_app.access.roles import OPERATOR
from tools_app.models import IdempotencyRecord
from tools_app.toolkit.calls import Caller, call_tool
from tools_app.toolkit.registry import get_tool

pytestmark = pytest.mark.django_db

RECORDS = "/api/v1/idempotency-records"
ORDER = {"customer": "Jane Roe", "currency": "EUR", "items": [{"sku": "B-1", "quantity": 1, "unit_price": "2"}]}


def order(tenant, key, **changes):
    caller = Caller(tenant_id=tenant.pk, actor="agent:acme/bot")
    result = call_tool(get_tool("create_order"), caller, {**ORDER, **changes, "idempotency_key": key})
    return IdempotencyRecord.objects.get(tenant=tenant, key=key), result.result


def test_a_record_keeps_its_tools_search_fields_from_the_arguments_and_the_result_never_a_personal_one(tenant):
    record, result = order(tenant, "o-1")

    assert record.attributes == {"currency": "EUR", "order_id": str(result["order_id"])}
    assert "customer" not in record.attributes  # personal: never searchable


def test_the_api_filters_by_attribute_repeatable_and_refuses_a_bad_form_with_a_400(tenant, other_tenant):
    first, result = order(tenant, "o-1")
    second, _ = order(tenant, "o-2", currency="USD")
    order(other_tenant, "o-1")  # another tenant's: never listed
    client = key_client(tenant)

    by_id = client.get(RECORDS, {"attribute": f"order_id={result['order_id']}"})
    by_currency = client.get(RECORDS, {"attribute": "currency=USD"})
    both = client.get(RECORDS, {"attribute": [f"order_id={result['order_id']}", "currency=USD"]})
    malformed = client.get(RECORDS, {"attribute": "order_id"})
    undeclared = client.get(RECORDS, {"attribute": "customer=Jane Roe"})

    assert ids(by_id) == [first.pk] and ids(by_currency) == [second.pk] and ids(both) == []
    assert by_id.json()["results"][0]["attributes"] == first.attributes
    assert malformed.status_code == undeclared.status_code == 400
    assert "name=value" in malformed.content.decode()
    assert "'customer' is no tool's search field" in undeclared.content.decode()


def test_find_opens_the_record_of_an_attribute_given_as_name_equals_value_or_as_the_value_alone(client, tenant):
    record, result = order(tenant, "o-1")
    dollars, _ = order(tenant, "o-2", currency="USD")
    client.force_login(make_operator("alice", OPERATOR, tenant))

    named = client.post(reverse("admin:find"), {"q": f"order_id={result['order_id']}"})
    alone = client.post(reverse("admin:find"), {"q": "USD"})
    nothing = client.post(reverse("admin:find"), {"q": "order_id=999999"})

    assert named.status_code == alone.status_code == 303
    assert named["Location"] == reverse("admin:tools_app_idempotencyrecord_change", args=[record.pk])
    assert alone["Location"] == reverse("admin:tools_app_idempotencyrecord_change", args=[dollars.pk])
    assert nothing.status_code == 200 and "Nothing you may see matches" in nothing.content.decode()
