"""The console shows personal values decrypted to whoever may see them (`view_personal_values`: operators and
approvers) and `[personal]` to the rest (auditors); a value whose key was destroyed reads `[forgotten]` and a
damaged one `[unreadable]`, on a page that answers 200, never an error. Crafted requests, real pages."""

import json
import uuid

from django.db import connection
from django.urls import reverse

from tests.support.operators import make_operator
from tools_app.access.roles import AUDITOR, OPERATOR
from tools_app.core import keystore, personal
from tools_app.models import IdempotencyRecord, OutboxEvent
from tools_app.toolkit.calls import call_tool
from tools_app.toolkit.registry import get_tool

CANARY = "cnry41c0n5"


def an_order(caller, key="o-1") -> IdempotencyRecord:
    answered = call_tool(get_tool("create_order"), caller, {
        "customer": f"Mr {CANARY}", "currency": "EUR", "idempotency_key": key,
        "items": [{"sku": "BOLT-1", "quantity": 1, "unit_price": "2.50"}]})
    assert answered.error is None, answered.error
    return IdempotencyRecord.objects.get(key=key)


def a_notification(caller) -> OutboxEvent:
    answered = call_tool(get_tool("send_notification"), caller, {
        "channel": "email", "recipient": f"{CANARY}@example.invalid", "subject": "Hello", "body": f"Dear {CANARY}",
        "idempotency_key": "n-1"})
    assert answered.error is None, answered.error
    return OutboxEvent.objects.get(kind="notification.email")


def record_page(client, record):
    return client.get(reverse("admin:tools_app_idempotencyrecord_change", args=[record.pk]))


def test_an_operator_sees_personal_values_and_an_auditor_sees_personal(client, caller, tenant):
    record, event = an_order(caller), a_notification(caller)
    olga, audrey = make_operator("olga", OPERATOR, tenant), make_operator("audrey", AUDITOR, tenant)
    assert olga.has_perm(personal.VIEW_PERSONAL_VALUES) and not audrey.has_perm(personal.VIEW_PERSONAL_VALUES)
    outbox_page = reverse("admin:tools_app_outboxevent_change", args=[event.pk])

    client.force_login(olga)
    page, outbox = record_page(client, record), client.get(outbox_page)
    assert page.status_code == 200 and outbox.status_code == 200
    assert f"Mr {CANARY}" in page.content.decode() and f"{CANARY}@example.invalid" in outbox.content.decode()

    client.force_login(audrey)
    page, outbox = record_page(client, record), client.get(outbox_page)
    assert page.status_code == 200 and outbox.status_code == 200
    for body in (page.content.decode(), outbox.content.decode()):
        assert CANARY not in body and personal.PERSONAL in body, body
    assert "EUR" in page.content.decode()  # what is not personal stays readable


def test_a_destroyed_key_reads_forgotten_and_a_damaged_value_unreadable_on_a_page_that_answers(
        client, caller, tenant):
    record = an_order(caller)
    client.force_login(make_operator("olga", OPERATOR, tenant))

    # a damaged ciphertext in the result: the page answers, and says so where the value was
    with connection.cursor() as cursor:
        cursor.execute("UPDATE tools_app_idempotencyrecord SET result = jsonb_set(result, '{customer,$personal}', "
                       "to_jsonb(left(result->'customer'->>'$personal', -8) || 'AAAAAAA=')) WHERE id = %s",
                       [record.pk])
    page = record_page(client, record)
    assert page.status_code == 200
    body = page.content.decode()
    assert personal.UNREADABLE in body and f"Mr {CANARY}" in body  # the arguments still open

    # the key destroyed: forgotten, to the operator as to everyone
    with connection.cursor() as cursor:
        cursor.execute("SELECT arguments::text FROM tools_app_idempotencyrecord WHERE id = %s", [record.pk])
        key_id = json.loads(cursor.fetchone()[0])["customer"][personal.MARK].split(":")[1]
    assert keystore.destroy(uuid.UUID(key_id), by="test")
    page = record_page(client, record)
    assert page.status_code == 200
    body = page.content.decode()
    assert personal.FORGOTTEN in body and CANARY not in body
