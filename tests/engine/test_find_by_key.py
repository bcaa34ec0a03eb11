"""Find by key: one box, whatever is quoted (a raw key, its digest, an operation, task or approval id, a
downstream key, a trace id), within the tenants the operator may see; the raw key is never echoed."""

import pytest
from django.urls import reverse

from tests.support.approvals_support import STAFF_NOTE, call, pending_request
from tests.support.operators import make_operator
from tests.support.tasks_support import TEXT, start
from tools_app import engine
from tools_app.access.roles import APPROVER, OPERATOR
from tools_app.core import keys
from tools_app.models import IdempotencyRecord, OutboxEvent
from tools_app.toolkit.calls import Caller

FIND = reverse("admin:find")
KEY = "order-2026-0042:jane.roe.example.com"
ORDER = {"customer": "ACME", "currency": "EUR", "items": [{"sku": "BOLT-1", "quantity": 1, "unit_price": "2.50"}]}


def record_url(record) -> str:
    return reverse("admin:tools_app_idempotencyrecord_change", args=[record.pk])


def order(caller, key=KEY, **overrides):
    return call(caller, "create_order", idempotency_key=key, **{**ORDER, **overrides})


@pytest.fixture
def olga(client, tenant):
    client.force_login(make_operator("olga", OPERATOR, tenant))


@pytest.fixture
def root(client, django_user_model):
    client.force_login(django_user_model.objects.create_superuser("root", "r@example.invalid", "pw"))


def test_a_pasted_key_opens_its_record_and_the_answer_never_echoes_the_key(caller, client, olga):
    order(caller)
    record = IdempotencyRecord.objects.get()

    found = client.post(FIND, {"q": f"  {KEY} "})
    missing = client.post(FIND, {"q": "order-2026-0043:jane.roe.example.com"})

    assert (found.status_code, found.url) == (303, record_url(record))
    assert missing.status_code == 200 and missing.context["matches"] == []
    assert b"jane.roe" not in missing.content and keys.key_digest("order-2026-0043:jane.roe.example.com").encode() in (
        missing.content)
    # Django's error reports leave the box out, and the page was a POST: no key in any URL or access log
    assert missing.wsgi_request.sensitive_post_parameters == ("q",)


def test_a_key_in_a_url_searches_nothing(caller, client, olga):
    order(caller)

    response = client.get(FIND, {"q": KEY})

    assert response.status_code == 200 and response.context["matches"] is None


def test_the_same_key_in_two_tenants_lists_both_and_picking_a_tenant_opens_one(caller, client, root, other_tenant):
    order(caller)
    order(Caller(tenant_id=other_tenant.pk, actor="agent:globex/test"))
    theirs = IdempotencyRecord.objects.get(tenant=other_tenant)

    both = client.post(FIND, {"q": KEY})
    picked = client.post(FIND, {"q": KEY, "tenant": other_tenant.pk})

    assert sorted(m.tenant for m in both.context["matches"]) == ["acme", "globex"]
    assert [m.how for m in both.context["matches"]] == [["idempotency key"], ["idempotency key"]]
    assert picked.url == record_url(theirs)


def test_picking_the_tool_narrows_a_key_used_by_two_tools(caller, client, olga):
    order(caller, key="same-key")
    call(caller, "create_ticket", idempotency_key="same-key", subject="Printer", body="Jammed")
    ticket = IdempotencyRecord.objects.get(tool="create_ticket")

    both = client.post(FIND, {"q": "same-key"})
    picked = client.post(FIND, {"q": "same-key", "tool": "create_ticket"})

    assert len(both.context["matches"]) == 2 and picked.url == record_url(ticket)


def test_an_operator_never_finds_another_tenants_record(caller, client, olga, other_tenant):
    order(Caller(tenant_id=other_tenant.pk, actor="agent:globex/test"))
    theirs = IdempotencyRecord.objects.get()

    for text in (KEY, str(theirs.operation_id), theirs.downstream_key or "x", str(theirs.pk)):
        response = client.post(FIND, {"q": text})
        assert response.status_code == 200 and response.context["matches"] == [], text
    refused = client.post(FIND, {"q": KEY, "tenant": other_tenant.pk})
    assert "tenant" in refused.context["form"].errors


def test_every_id_an_operator_is_quoted_finds_its_object(caller, client, root, tenant, downstreams):
    pay = call(caller, "request_payment", idempotency_key="pay-1", amount="12.00", currency="EUR", payee="Bob")
    payment = IdempotencyRecord.objects.get(tool="request_payment")
    request = pending_request(call(caller, "publish_announcement", idempotency_key="a-1", **STAFF_NOTE))
    task = start(caller, {"text": TEXT, "format": "markdown"}, key="t-1")
    call(caller, "send_notification", idempotency_key="n-1", channel="email", recipient="ops@example.com",
         subject="Disk", body="full")
    event = OutboxEvent.objects.get(record__tool="send_notification")
    assert pay.error is None

    def found(text, **form):
        response = client.post(FIND, {"q": text, **form})
        if response.status_code == 303:
            return response.url
        return sorted((m.kind, m.how[0]) for m in response.context["matches"])

    assert found(str(payment.operation_id)) == record_url(payment)
    assert found(payment.downstream_key) == record_url(payment)
    assert found(keys.key_digest(payment.key)) == record_url(payment)  # the key: the id the server issued
    assert found(payment.trace_id) == record_url(payment)  # the W3C trace of the agent's call
    assert found(str(task.pk)) == reverse("admin:tools_app_task_change", args=[task.pk])
    assert found(str(event.pk)) == reverse("admin:tools_app_outboxevent_change", args=[event.pk])
    # a number is an approval request id and a record id: whichever exist are found
    by_number = found(f"#{request.pk}")
    approval = reverse("admin:approval_link", args=[request.pk])
    assert by_number == approval or ("approval request", "approval request id") in by_number
    assert found(f"#{payment.pk}", tool="request_payment") == record_url(payment)


def test_a_released_keys_earlier_operation_is_found_with_the_live_one(caller, client, root):
    order(caller)
    first = IdempotencyRecord.objects.get()
    IdempotencyRecord.objects.filter(pk=first.pk).update(retired_at=first.created_at)
    order(caller)

    matches = client.post(FIND, {"q": KEY}).context["matches"]

    assert {m.obj.pk for m in matches} == set(IdempotencyRecord.objects.values_list("pk", flat=True))
    assert len(matches) == 2
    assert engine.records_with_key(KEY, tenant_ids=[first.tenant_id], tools=["create_order"]).count() == 2


def test_an_approver_finds_an_approval_request_by_its_trace_id(caller, client, tenant):
    request = pending_request(call(caller, "publish_announcement", idempotency_key="a-1", **STAFF_NOTE))
    client.force_login(make_operator("bob", APPROVER, tenant))

    response = client.post(FIND, {"q": request.trace_id})

    # the request and the call's record carry the trace: both are listed, the request linked to its page
    matches = {(m.kind, m.url) for m in response.context["matches"]}
    assert ("approval request", reverse("admin:approval_link", args=[request.pk])) in matches
