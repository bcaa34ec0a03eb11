"""send_notification through the outbox to a real SMTP/webhook sink."""

import subprocess
import sys
import time
import uuid

import pytest
from django.utils import timezone

from idemops.conf import override_conf
from tests.operators import make_operator
from tests.processes import ROOT, child_env, manage
from tools_app import outbox
from tools_app.access.roles import OPERATOR
from tools_app.models import AuditEvent, OutboxEvent, OutboxStatus
from tools_app.toolkit.calls import Caller, call_tool
from tools_app.toolkit.registry import get_tool

pytestmark = pytest.mark.live


def notify(tenant, key, channel="email", recipient="ops@example.com", subject="Disk full"):
    caller = Caller(tenant_id=tenant.pk, actor="agent:acme/test")
    return call_tool(get_tool("send_notification"), caller, {
        "channel": channel, "recipient": recipient, "subject": subject, "body": "Please look.",
        "idempotency_key": key})


@pytest.fixture
def tenant(transactional_db):
    from tools_app import access

    return access.create_tenant("acme")


def test_a_notification_is_queued_in_the_call_and_delivered_once(tenant, downstreams, sink):
    first = notify(tenant, "n-1")
    again = notify(tenant, "n-1")

    assert first.result["notification_id"] == again.result["notification_id"] and again.replayed
    assert OutboxEvent.objects.count() == 1
    manage("relay_outbox", env=downstreams)

    event = OutboxEvent.objects.get()
    assert (event.status, event.attempts) == (OutboxStatus.DELIVERED, 1)
    assert sink.messages() == {str(event.id): 1}


def test_a_webhook_notification_carries_its_event_id(tenant, downstreams, sink):
    result = notify(tenant, "n-hook", channel="webhook", recipient=f"{sink.url}/webhooks/ops")

    manage("relay_outbox", env=downstreams)

    assert sink.sql("SELECT channel, recipient FROM messages WHERE event_id = %s",
                    [result.result["notification_id"]]) == [("webhook", "ops")]


def test_a_webhook_off_the_allow_list_is_refused(tenant, downstreams):
    result = notify(tenant, "n-evil", channel="webhook", recipient="http://169.254.169.254/latest")

    assert result.error.error_class == "invalid_input"
    assert OutboxEvent.objects.count() == 0


def test_a_relay_killed_mid_batch_loses_nothing_and_duplicates_nothing(tenant, downstreams, sink):
    # given: six queued notifications and a sink that takes a second per delivery
    ids = {notify(tenant, f"batch-{i}").result["notification_id"] for i in range(6)}
    sink.set_faults(delay_seconds=1.0)
    relay = subprocess.Popen([sys.executable, "manage.py", "relay_outbox", "--one-batch", "--batch-size", "6"],
                             cwd=ROOT, env=child_env(**downstreams), start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    # when: the relay is SIGKILLed after delivering some, before committing their "delivered"
    wait_for(lambda: len(sink.messages()) >= 2)
    relay.kill()
    relay.wait()
    assert OutboxEvent.objects.filter(status=OutboxStatus.DELIVERED).count() == 0
    sink.set_faults(delay_seconds=0)
    manage("relay_outbox", env=downstreams)

    # then: every event delivered, each notification received once, some of them redelivered and deduplicated
    assert set(OutboxEvent.objects.filter(status=OutboxStatus.DELIVERED).values_list("id", flat=True)) == \
        {uuid.UUID(i) for i in ids}
    received = sink.messages()
    assert set(received) == ids
    assert max(received.values()) == 2


def test_failed_deliveries_back_off_then_dead_letter_then_redrive(tenant, downstreams, sink, settings):
    override_conf(settings, outbox_max_attempts=2, outbox_backoff_seconds=30)
    event_id = notify(tenant, "n-fail").result["notification_id"]
    sink.set_faults(fail_times=10)


    assert outbox.relay_batch().retried == 1
    event = OutboxEvent.objects.get()
    assert (event.status, event.attempts) == (OutboxStatus.PENDING, 1)
    assert event.next_attempt_at > timezone.now()  # backed off: not due yet
    assert outbox.relay_batch().handled == 0
    OutboxEvent.objects.update(next_attempt_at=timezone.now())

    assert outbox.relay_batch().dead == 1
    event.refresh_from_db()
    assert event.status == OutboxStatus.DEAD and "451" in event.last_error
    assert AuditEvent.objects.filter(action="outbox.dead_lettered", object_id=event_id).exists()

    sink.set_faults(fail_times=0)
    assert outbox.redrive(event, make_operator("ops", OPERATOR, tenant), reason="sink fixed")
    assert outbox.relay_batch().delivered == 1
    assert sink.messages() == {event_id: 1}


def wait_for(condition, timeout=30):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)
