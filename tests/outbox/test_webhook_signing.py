"""Every webhook idemops sends is signed the Standard Webhooks way with its tenant's secret; the
notification sink (a real process) verifies it with the `standardwebhooks` library and refuses a
forged one. The secret is shown once, rotated from the console, and the previous one keeps signing
for the overlap."""

import base64
import json
import time
import uuid
from datetime import timedelta

import httpx2
import pytest
from django.utils import timezone
from standardwebhooks import Webhook

from tests.support.operators import make_operator
from tests.support.processes import manage
from tools_app import access, outbox
from tools_app.access.models import WebhookSecret
from tools_app.access.roles import APPROVER, OPERATOR
from tools_app.core import redaction
from tools_app.core.errors import PermissionDenied
from tools_app.models import AuditEvent, OutboxEvent, OutboxStatus
from tools_app.toolkit.calls import Caller, call_tool
from tools_app.toolkit.registry import get_tool

pytestmark = pytest.mark.live


@pytest.fixture
def tenant(transactional_db):
    return access.create_tenant("acme")


@pytest.fixture
def operator(tenant):
    return make_operator("olga", OPERATOR, tenant)


def webhook(tenant, key, sink, name="ops"):
    caller = Caller(tenant_id=tenant.pk, actor="agent:acme/test")
    result = call_tool(get_tool("send_notification"), caller, {
        "channel": "webhook", "recipient": f"{sink.url}/webhooks/{name}", "subject": "Disk full",
        "body": "Please look.", "idempotency_key": key})
    return result.result["notification_id"]


def test_a_webhook_is_signed_with_the_secret_the_console_showed_and_the_sink_verifies_it(
        tenant, operator, downstreams, sink):
    secret = access.rotate_webhook_secret(tenant, operator)
    sink.require_signatures("ops", secret)

    event_id = webhook(tenant, "n-1", sink)
    manage("relay_outbox", env=downstreams)

    assert OutboxEvent.objects.get(pk=event_id).status == OutboxStatus.DELIVERED
    assert sink.signatures() == {event_id: "verified"}
    assert sink.webhook_attempts() == [(event_id, "ops", "stored")]


def test_a_finished_tasks_webhook_is_signed_too(tenant, operator, downstreams, sink):
    secret = access.rotate_webhook_secret(tenant, operator)
    sink.require_signatures("tasks", secret)

    event = outbox.enqueue(tenant_id=tenant.pk, kind="task.webhook",
                           payload={"recipient": f"{sink.url}/webhooks/tasks", "json": {"task_id": "t-1"}})
    manage("relay_outbox", env=downstreams)

    assert sink.signatures() == {str(event.id): "verified"}


def test_a_webhook_signed_with_another_secret_is_refused_and_redelivered_under_the_same_id(
        tenant, operator, downstreams, sink):
    access.rotate_webhook_secret(tenant, operator)
    sink.require_signatures("ops", "whsec_" + base64.b64encode(b"x" * 32).decode())  # not the tenant's

    event_id = webhook(tenant, "n-2", sink)
    manage("relay_outbox", env=downstreams)

    event = OutboxEvent.objects.get(pk=event_id)
    assert (event.status, event.attempts, event.last_error) == (OutboxStatus.PENDING, 1, "HTTP 401")
    assert sink.messages() == {}
    # The receiver is given the right secret; the retry carries the same webhook-id, freshly signed.
    sink.require_signatures("ops", redaction.unseal(WebhookSecret.objects.get(tenant=tenant).sealed)["current"])
    OutboxEvent.objects.filter(pk=event_id).update(next_attempt_at=timezone.now() - timedelta(seconds=1))
    manage("relay_outbox", env=downstreams)

    assert sink.webhook_attempts() == [(event_id, "ops", "forged"), (event_id, "ops", "stored")]
    assert sink.signatures() == {event_id: "verified"}


def test_the_sink_refuses_a_forged_or_unsigned_webhook_and_stores_nothing(tenant, operator, sink):
    secret = access.rotate_webhook_secret(tenant, operator)
    sink.require_signatures("ops", secret)
    body = json.dumps({"subject": "Pay this", "body": "to account 666"})
    event_id, sent_at = str(uuid.uuid4()), str(int(time.time()))
    forger = Webhook("whsec_" + base64.b64encode(b"not the tenant's secret, 32 bytes").decode())
    forged = forger.sign(event_id, timezone.now(), body)
    genuine = Webhook(secret).sign(event_id, timezone.now(), body)

    def post(headers):
        return httpx2.post(f"{sink.url}/webhooks/ops", content=body, timeout=10,
                           headers={"Content-Type": "application/json", "webhook-id": event_id,
                                    "webhook-timestamp": sent_at, **headers})

    assert post({"webhook-signature": forged}).status_code == 401
    assert post({}).status_code == 401
    assert sink.messages() == {}
    assert post({"webhook-signature": genuine}).status_code == 202  # the same request, truly signed
    assert sink.signatures() == {event_id: "verified"}


def test_after_a_rotation_both_secrets_sign_until_the_overlap_ends(tenant, operator, downstreams, sink):
    old = access.rotate_webhook_secret(tenant, operator)
    new = access.rotate_webhook_secret(tenant, operator)
    sink.require_signatures("old-receiver", old)
    sink.require_signatures("new-receiver", new)

    during = [webhook(tenant, "r-1", sink, "old-receiver"), webhook(tenant, "r-2", sink, "new-receiver")]
    manage("relay_outbox", env=downstreams)
    assert sink.signatures() == {event_id: "verified" for event_id in during}

    WebhookSecret.objects.filter(tenant=tenant).update(previous_valid_until=timezone.now() - timedelta(seconds=1))
    after = [webhook(tenant, "r-3", sink, "old-receiver"), webhook(tenant, "r-4", sink, "new-receiver")]
    manage("relay_outbox", env=downstreams)

    assert OutboxEvent.objects.get(pk=after[0]).last_error == "HTTP 401"  # the old secret signs no more
    assert sink.signatures() == {**{event_id: "verified" for event_id in during}, after[1]: "verified"}
    assert [(e.action, e.actor) for e in AuditEvent.objects.filter(action__startswith="webhook_secret.")
            .order_by("created_at")] == [("webhook_secret.created", "user:olga"),
                                         ("webhook_secret.rotated", "user:olga")]


def test_a_tenant_without_a_secret_gets_one_at_its_first_webhook_so_nothing_leaves_unsigned(
        tenant, downstreams, sink):
    event_id = webhook(tenant, "n-3", sink)
    manage("relay_outbox", env=downstreams)

    row = WebhookSecret.objects.get(tenant=tenant)
    assert row.prefix.startswith("whsec_") and "whsec_" not in row.sealed  # stored sealed, never raw
    assert OutboxEvent.objects.get(pk=event_id).status == OutboxStatus.DELIVERED
    assert AuditEvent.objects.filter(action="webhook_secret.created", actor="system:webhook-signing").count() == 1


def test_a_person_without_the_permission_cannot_rotate_and_the_refusal_is_audited(tenant):
    approver = make_operator("abe", APPROVER, tenant)

    with pytest.raises(PermissionDenied):
        access.rotate_webhook_secret(tenant, approver)

    assert WebhookSecret.objects.get(tenant=tenant).sealed == ""
    assert AuditEvent.objects.filter(action="webhook_secret.rotate_refused", actor="user:abe").count() == 1


def test_the_console_shows_a_new_secret_once_and_it_is_the_one_that_signs(tenant, operator, client):
    client.force_login(operator)

    page = client.post("/admin/tools_app/tenant/", {"action": "rotate_webhook_secret",
                                                    "_selected_action": [tenant.pk]})

    assert page.status_code == 200
    shown = page.content.decode().split('class="webhook-secret">')[1].split("<")[0]
    assert shown == redaction.unseal(WebhookSecret.objects.get(tenant=tenant).sealed)["current"]
    listing = client.get("/admin/tools_app/tenant/").content.decode()
    assert shown[:12] in listing and shown not in listing
