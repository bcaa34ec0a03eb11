"""A payment key held past its retention is released by an operator, with evidence; a new operation then pays
once more.

request_payment never silently reuses a key after its retention (ExpiryPolicy.HOLD): the call answers
`expired` until an operator has checked the gateway and releases the key in the admin. Its key is an
operation id issued by prepare_operation, which named that payment: once released, the id is spent,
and paying again is a new operation with a new id.
"""

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from tests.support.issued_ids import call_labelled_sync
from tests.support.mcp_client import error_of
from tests.support.operators import make_operator
from tools_app import reconciliation
from tools_app.access.roles import APPROVER, AUDITOR, OPERATOR
from tools_app.core.errors import InvalidInput
from tools_app.models import AuditEvent, IdempotencyRecord, Tenant

pytestmark = pytest.mark.live

PAYMENT = {"amount": "42.50", "currency": "EUR", "payee": "ACME Supplies", "reference": "INV-7"}


def pay(web_server, token, key="p-held"):
    return call_labelled_sync(web_server.mcp_url, token, "request_payment", {**PAYMENT, "idempotency_key": key})


def past_retention() -> IdempotencyRecord:
    """Time passes: the payment's retention ends (and so did the time of the id issued for it)."""
    IdempotencyRecord.objects.update(expires_at=timezone.now() - timedelta(minutes=1))
    return IdempotencyRecord.objects.get(tool="request_payment")


def release_url(record) -> str:
    return reverse("admin:tools_app_idempotencyrecord_act", args=[record.pk, "release_held_key"])


def test_an_operator_releases_a_held_payment_key_with_evidence_and_a_new_operation_pays_exactly_once_more(
        web_server, token, downstreams, gateway, client):
    # given: a payment whose key is past its retention, so the agent's call with it is held
    acme = Tenant.objects.get(slug="acme")
    first = pay(web_server, token)
    held = past_retention()
    assert error_of(pay(web_server, token))["class"] == "expired"
    assert len(gateway.payments()) == 1

    # when: an approver and an auditor craft the release the operator's button sends
    for username, role in (("bob", APPROVER), ("ann", AUDITOR)):
        client.force_login(make_operator(username, role, acme))
        crafted = client.post(release_url(held), {"reason": "the agent asked", "checked": "nothing"})
        assert crafted.status_code == 403, username

    # then: both refused and audited, and the key is still held
    refusals = AuditEvent.objects.filter(action="record.release_refused", object_id=str(held.pk))
    assert sorted(refusals.values_list("actor", flat=True)) == ["user:ann", "user:bob"]
    assert IdempotencyRecord.objects.get(pk=held.pk).retired_at is None
    assert error_of(pay(web_server, token))["class"] == "expired"

    # when: the operator opens the record, tries without saying what was checked, then releases with evidence
    client.force_login(make_operator("olga", OPERATOR, acme))
    page = client.get(reverse("admin:tools_app_idempotencyrecord_change", args=[held.pk]))
    incomplete = client.post(release_url(held), {"reason": "customer wants to pay again", "checked": ""})
    done = client.post(release_url(held), {
        "reason": "customer wants to pay again", "checked": "gateway dashboard: payment refunded on request",
        "downstream_reference": first.structured_content["payment_id"]}, follow=True)

    # then: the button was there, the incomplete form changed nothing, and the release is evidence and audited
    assert b'id="action-release_held_key"' in page.content and held.downstream_key.encode() in page.content
    assert incomplete.status_code == 200 and b"This field is required" in incomplete.content
    assert any("released" in str(m) for m in done.context["messages"])
    released = IdempotencyRecord.objects.get(pk=held.pk)
    assert released.retired_at is not None
    evidence = released.evidence[-1]
    assert (evidence["source"], evidence["actor"], evidence["checked"], evidence["downstream_reference"]) == (
        "operator", "user:olga", "gateway dashboard: payment refunded on request",
        first.structured_content["payment_id"])
    event = AuditEvent.objects.get(action="record.released", object_id=str(held.pk))
    assert (event.actor, event.reason) == ("user:olga", "customer wants to pay again")
    assert event.after["checked"] == "gateway dashboard: payment refunded on request"
    shown = client.get(reverse("admin:tools_app_idempotencyrecord_change", args=[held.pk])).content.decode()
    assert "gateway dashboard: payment refunded on request" in shown  # the record page shows its evidence

    # when: the agent calls again with the id: it named the released payment, so it names no new one
    spent = error_of(pay(web_server, token))
    assert spent["class"] == "invalid_input" and spent["operation_id_required"] is True
    assert len(gateway.payments()) == 1

    # when: the agent prepares the payment again, as a new operation, and pays with the new id, twice
    second = pay(web_server, token, "p-again")
    replay = pay(web_server, token, "p-again")

    # then: one new payment, under a new downstream key, and the retry replays it
    assert not second.is_error and second.structured_content["idempotency"]["replayed"] is False
    assert second.structured_content["payment_id"] != first.structured_content["payment_id"]
    assert replay.structured_content["payment_id"] == second.structured_content["payment_id"]
    assert replay.structured_content["idempotency"]["replayed"] is True
    payments = gateway.payments()
    assert len(payments) == 2
    records = IdempotencyRecord.objects.filter(tool="request_payment").order_by("pk")
    assert [r.downstream_key for r in records] == [p[1] for p in payments]
    assert records[0].downstream_key != records[1].downstream_key


def test_only_a_key_past_its_retention_can_be_released_and_never_without_saying_what_was_checked(
        web_server, token, downstreams, gateway):
    pay(web_server, token)
    olga = make_operator("olga", OPERATOR, Tenant.objects.get(slug="acme"))
    record = IdempotencyRecord.objects.get(tool="request_payment")

    assert reconciliation.release_held_key(record, olga, reason="early", checked="gateway: paid") is False
    with pytest.raises(InvalidInput, match="what you checked"):
        reconciliation.release_held_key(past_retention(), olga, reason="expired now", checked="  ")

    assert IdempotencyRecord.objects.get(pk=record.pk).retired_at is None
    assert not AuditEvent.objects.filter(action="record.released").exists()
    assert error_of(pay(web_server, token))["class"] == "expired"
    assert len(gateway.payments()) == 1
