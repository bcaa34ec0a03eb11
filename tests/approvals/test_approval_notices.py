"""Approvers are told: a message through the outbox when a request needs them, another when it waits too long."""

import json
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.db import transaction
from django.urls import reverse
from django.utils import timezone
from django_q.models import Schedule

from tests.support.approvals_support import STAFF_NOTE, call, pending_request
from tests.support.operators import agent_owner, make_operator
from tools_app import access, approvals, outbox
from tools_app.access.roles import APPROVER, OPERATOR
from tools_app.conf import override_conf
from tools_app.core.jobs import JOBS
from tools_app.models import ApprovalRequest, ApprovalSettings, ApprovalStatus, AuditEvent, OutboxEvent
from tools_app.toolkit.calls import Caller

PUBLIC_URL = "https://ops.example.com"


@pytest.fixture
def people(tenant, other_tenant):
    """Approvers with and without an address, an operator, another tenant's approver."""
    alice = make_operator("alice", APPROVER, tenant)
    alice.email = "alice@example.invalid"
    alice.save()
    make_operator("bob", APPROVER, tenant)  # no email address: cannot be told
    olga = make_operator("olga", OPERATOR, tenant)
    olga.email = "olga@example.invalid"
    olga.save()
    gina = make_operator("gina", APPROVER, other_tenant)
    gina.email = "gina@example.invalid"
    gina.save()
    return alice


@pytest.fixture
def public_url(settings):
    override_conf(settings, public_url=PUBLIC_URL)


def emails() -> list[dict]:
    return [e.payload for e in OutboxEvent.objects.filter(kind="notification.email").order_by("created_at")]


def test_a_new_request_emails_the_tenants_approvers_through_the_outbox_with_a_link(caller, people, public_url):
    request = pending_request(call(caller, "publish_announcement", idempotency_key="a-1", **STAFF_NOTE))

    [message] = emails()
    assert message["recipient"] == "alice@example.invalid"
    summary = "Publish to staff: “[personal]” (11 characters)"  # the title is personal: the console shows it
    assert summary in message["subject"] and summary in message["body"]
    assert "Maintenance" not in message["subject"] + message["body"]
    # alice's own one-click link (tests/approvals/test_approval_links.py), not the console's page of the request
    link = f"{PUBLIC_URL}{reverse('admin:approval_decide', args=['TOKEN'])}".replace("TOKEN/", "")
    assert link in message["body"] and "agent:acme/test" in message["body"]
    assert reverse("admin:approval_link", args=[request.pk]) not in message["body"]
    assert "Down at 2am" not in message["body"]  # the arguments stay in the console
    assert OutboxEvent.objects.get().record_id == request.record_id


def test_the_owner_of_the_agent_that_asked_is_not_asked_to_approve(tenant, public_url):
    olivia = make_operator("olivia", APPROVER, tenant)
    olivia.email = "olivia@example.invalid"
    olivia.save()
    token, _ = access.issue_token(tenant, "billing-agent", owner=olivia)

    call(Caller(tenant_id=tenant.pk, actor=token.agent_identity), "publish_announcement", idempotency_key="a-1",
         **STAFF_NOTE)

    assert ApprovalRequest.objects.get().requester_owner == olivia
    assert emails() == []


def test_no_request_no_message_when_its_transaction_rolls_back(caller, people):
    with pytest.raises(RuntimeError), transaction.atomic():
        call(caller, "publish_announcement", idempotency_key="a-1", **STAFF_NOTE)
        assert OutboxEvent.objects.count() == 1
        raise RuntimeError("the caller's transaction fails after the request was made")

    assert not ApprovalRequest.objects.exists() and not OutboxEvent.objects.exists()


def test_the_messages_reach_the_notification_sink_and_the_tenants_webhook(caller, people, tenant, downstreams, sink):
    ApprovalSettings.objects.create(tenant=tenant, notify_webhook_url=f"{sink.url}/webhooks/approvals")
    request = pending_request(call(caller, "publish_announcement", idempotency_key="a-1", **STAFF_NOTE))

    report = outbox.relay_batch()

    assert (report.delivered, report.dead) == (2, 0)
    delivered = {row["channel"]: row for row in _sink_messages(sink)}
    assert delivered["email"]["recipient"] == "alice@example.invalid"
    hook = json.loads(delivered["webhook"]["body"])
    assert hook["data"]["event"] == "approval.requested" and hook["data"]["request_id"] == request.pk
    assert hook["data"]["url"].endswith(reverse("admin:approval_link", args=[request.pk]))
    assert hook["data"]["escalated"] is False


def _sink_messages(sink) -> list[dict]:
    rows = sink.sql("SELECT channel, recipient, subject, body FROM messages ORDER BY first_received_at")
    return [dict(zip(["channel", "recipient", "subject", "body"], row, strict=True)) for row in rows]


# --- escalation ---------------------------------------------------------------------------------


def waited(request: ApprovalRequest, minutes: int) -> None:
    ApprovalRequest.objects.filter(pk=request.pk).update(created_at=timezone.now() - timedelta(minutes=minutes))


def test_a_request_still_waiting_past_the_escalation_time_is_escalated_once(caller, people, tenant):
    ApprovalSettings.objects.create(tenant=tenant, escalate_after_minutes=30, escalation_email="lead@example.invalid")
    request = pending_request(call(caller, "publish_announcement", idempotency_key="a-1", **STAFF_NOTE))
    waited(request, 29)
    assert approvals.escalate() == 0
    waited(request, 31)

    assert approvals.escalate() == 1
    assert approvals.escalate() == 0  # once

    request.refresh_from_db()
    assert request.escalated_at is not None and request.status == ApprovalStatus.PENDING
    event = AuditEvent.objects.get(action="approval.escalated")
    assert event.actor == approvals.APPROVAL_SWEEPER and event.after == {"waited_minutes": 31}
    escalations = [m for m in emails() if "ESCALATED" in m["subject"]]
    assert sorted(m["recipient"] for m in escalations) == ["alice@example.invalid", "lead@example.invalid"]
    assert "31 min" in escalations[0]["subject"]


def test_each_tenant_has_its_escalation_time_and_zero_never_escalates(caller, people, tenant, other_tenant):
    ApprovalSettings.objects.create(tenant=tenant, escalate_after_minutes=0)
    theirs = Caller(tenant_id=other_tenant.pk, actor="agent:globex/test")
    never = pending_request(call(caller, "publish_announcement", idempotency_key="a-1", **STAFF_NOTE))
    default = pending_request(call(theirs, "publish_announcement", idempotency_key="a-1", **STAFF_NOTE))
    waited(never, 600)
    waited(default, 61)  # a tenant without settings: the default, 60 minutes

    assert approvals.escalate() == 1

    assert list(ApprovalRequest.objects.filter(escalated_at__isnull=False)) == [default]


def test_decided_or_expired_requests_are_not_escalated(caller, people, tenant):
    decided = pending_request(call(caller, "publish_announcement", idempotency_key="a-1", **STAFF_NOTE))
    expired = pending_request(call(caller, "publish_announcement", idempotency_key="a-2", **STAFF_NOTE))
    approvals.reject(decided, people, reason="not now")
    ApprovalRequest.objects.filter(pk=expired.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    for request in (decided, expired):
        waited(request, 120)

    assert approvals.escalate() == 0
    assert not AuditEvent.objects.filter(action="approval.escalated").exists()


def test_escalation_runs_every_minute_on_the_cluster(db):
    schedule = Schedule.objects.get(name="approvals.escalate")
    assert (schedule.func, schedule.minutes) == (JOBS["approvals.escalate"], 1)


def test_a_webhook_off_the_allow_list_is_refused_when_the_settings_are_saved(client, tenant, django_user_model):
    client.force_login(django_user_model.objects.create_superuser("root", "r@example.invalid", "pw"))

    response = client.post(reverse("admin:tools_app_approvalsettings_add"), {
        "tenant": tenant.pk, "request_ttl_minutes": 60, "threshold_currency": "EUR", "escalate_after_minutes": 60,
        "notify_webhook_url": "https://evil.example.net/hook"})

    assert response.status_code == 200 and "not under a URL prefix" in response.content.decode()
    assert not ApprovalSettings.objects.exists()


def test_the_approval_link_opens_the_queue_page_while_pending_and_the_history_after(caller, client, people):
    request = pending_request(call(caller, "publish_announcement", idempotency_key="a-1", **STAFF_NOTE))
    client.force_login(people)
    link = reverse("admin:approval_link", args=[request.pk])

    pending = client.get(link)
    approvals.approve(request, people)
    decided = client.get(link)
    client.force_login(agent_owner("stranger"))  # no staff: the admin's login page, nothing else
    stranger = client.get(link)
    client.force_login(User.objects.get(username="gina"))  # another tenant's approver
    elsewhere = client.get(link)

    assert pending.url == reverse("admin:tools_app_approvalqueue_change", args=[request.pk])
    assert decided.url == reverse("admin:tools_app_approvalrequest_change", args=[request.pk])
    assert stranger.status_code == 302 and "/login/" in stranger.url
    assert elsewhere.status_code == 404
