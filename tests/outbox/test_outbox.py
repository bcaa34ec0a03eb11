"""send_notification through the outbox to a real SMTP/webhook sink."""

import subprocess
import sys
import time
import uuid

import pytest
from django.db import connection, transaction
from django.utils import timezone

from tests.support.operators import make_operator
from tests.support.processes import ROOT, child_env, manage
from tools_app import outbox
from tools_app.access.roles import OPERATOR
from tools_app.conf import override_conf
from tools_app.core import clock
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
    # given six queued notifications, a sink that takes a second per delivery, and a relay delivering one at a time
    ids = {notify(tenant, f"batch-{i}").result["notification_id"] for i in range(6)}
    sink.set_faults(delay_seconds=1.0)
    relay = subprocess.Popen([sys.executable, "manage.py", "relay_outbox", "--one-batch", "--batch-size", "6"],
                             cwd=ROOT, env=child_env(**downstreams, IDEMOPS_OUTBOX_DELIVERY_THREADS="1"),
                             start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    # when the relay is SIGKILLed in the middle of its batch
    wait_for(lambda: len(sink.messages()) >= 2)
    relay.kill()
    relay.wait()
    # then what it delivered before was recorded event by event (no transaction spans the batch) ...
    delivered = OutboxEvent.objects.filter(status=OutboxStatus.DELIVERED).count()
    assert 1 <= delivered < 6
    # ... and the rest waits for its claim to run out (as if IDEMOPS_OUTBOX_CLAIM_SECONDS had passed)
    assert manage("relay_outbox", env=downstreams).stdout.strip().startswith('{"delivered": 0')
    OutboxEvent.objects.filter(status=OutboxStatus.PENDING).update(claimed_until=timezone.now())
    sink.set_faults(delay_seconds=0)
    manage("relay_outbox", env=downstreams)

    # then every event delivered, each notification received, none more than twice (the one in flight)
    assert set(OutboxEvent.objects.filter(status=OutboxStatus.DELIVERED).values_list("id", flat=True)) == \
        {uuid.UUID(i) for i in ids}
    received = sink.messages()
    assert set(received) == ids
    assert max(received.values()) <= 2


def webhook(tenant, key, sink, name):
    return notify(tenant, key, channel="webhook", recipient=f"{sink.url}/webhooks/{name}")


def test_a_recipient_that_hangs_holds_up_no_other_event_and_the_relay_holds_no_lock_meanwhile(
        tenant, downstreams, sink):
    # given a poisoned recipient that never answers, queued first, and five healthy notifications
    sink.poison("poison", "hang", seconds=120)
    poison_id = webhook(tenant, "p-1", sink, "poison").result["notification_id"]
    healthy = {webhook(tenant, f"h-{i}", sink, "ops").result["notification_id"] for i in range(3)}
    healthy |= {notify(tenant, f"e-{i}").result["notification_id"] for i in range(2)}
    relay = subprocess.Popen([sys.executable, "manage.py", "relay_outbox"], cwd=ROOT,
                             env=child_env(**downstreams, IDEMOPS_WEBHOOK_TIMEOUT_SECONDS="10"),
                             start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # when the relay runs: the five are delivered and recorded while the poisoned one still hangs
        wait_for(lambda: OutboxEvent.objects.filter(status=OutboxStatus.DELIVERED).count() == 5, timeout=60)
        assert (poison_id, "poison", "received") in sink.webhook_attempts()  # its request is in flight
        poison = OutboxEvent.objects.get(pk=poison_id)
        assert poison.status == OutboxStatus.PENDING and poison.claimed_by and poison.attempts == 0

        # then no row of the outbox is locked and no transaction stays open across the delivery
        with transaction.atomic():
            locked = list(OutboxEvent.objects.select_for_update(nowait=True).values_list("id", flat=True))
        assert len(locked) == 6
        assert idle_in_transaction() == []
        assert set(map(str, OutboxEvent.objects.filter(status=OutboxStatus.DELIVERED).values_list(
            "id", flat=True))) == healthy

        # and the hanging delivery ends at its timeout as a failed attempt, to be retried later
        assert relay.wait(timeout=120) == 0
    finally:
        relay.kill()
    poison.refresh_from_db()
    assert (poison.status, poison.attempts, poison.claimed_by) == (OutboxStatus.PENDING, 1, "")
    assert poison.next_attempt_at > timezone.now() and "ReadTimeout" in poison.last_error


def idle_in_transaction() -> list[tuple]:
    """Other sessions of the test database sitting in an open transaction."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pid, query FROM pg_stat_activity WHERE datname = current_database() "
                       "AND state LIKE 'idle in transaction%%' AND pid <> pg_backend_pid()")
        return cursor.fetchall()


def test_an_event_that_always_fails_is_dead_lettered_while_the_others_are_delivered(
        tenant, downstreams, sink, settings):
    # A backoff far longer than a relay pass, so what a pass does is decided by the database's
    # clock, not by how fast this machine is: with a backoff of milliseconds the second attempt
    # came due within the pass on a fast run and after it on a slow one.
    override_conf(settings, outbox_max_attempts=2, outbox_backoff_seconds=60)
    sink.poison("broken", "fail")
    poison_id = webhook(tenant, "b-1", sink, "broken").result["notification_id"]
    healthy = {webhook(tenant, f"ok-{i}", sink, "ops").result["notification_id"] for i in range(4)}

    assert outbox.relay_pending() == {"delivered": 4, "retried": 1, "dead": 0, "lost": 0}
    assert outbox.relay_pending() == {"delivered": 0, "retried": 0, "dead": 0, "lost": 0}  # not due yet
    OutboxEvent.objects.filter(pk=poison_id).update(next_attempt_at=clock.NOW)  # its backoff is over
    assert outbox.relay_pending() == {"delivered": 0, "retried": 0, "dead": 1, "lost": 0}

    poison = OutboxEvent.objects.get(pk=poison_id)
    assert (poison.status, poison.attempts) == (OutboxStatus.DEAD, 2) and "HTTP 503" in poison.last_error
    assert [outcome for event_id, name, outcome in sink.webhook_attempts() if name == "broken"] == ["failed"] * 2
    assert {event_id: count for event_id, count in sink.messages().items()} == dict.fromkeys(healthy, 1)


def test_failed_deliveries_back_off_then_dead_letter_then_redrive(tenant, downstreams, sink, settings):
    override_conf(settings, outbox_max_attempts=2, outbox_backoff_seconds=30)
    event_id = notify(tenant, "n-fail").result["notification_id"]
    sink.set_faults(fail_times=10)


    assert outbox.relay_batch().retried == 1
    event = OutboxEvent.objects.get()
    assert (event.status, event.attempts) == (OutboxStatus.PENDING, 1)
    assert event.next_attempt_at > timezone.now()  # backed off: not due yet
    assert outbox.relay_batch().handled == 0
    OutboxEvent.objects.update(next_attempt_at=clock.NOW)

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
