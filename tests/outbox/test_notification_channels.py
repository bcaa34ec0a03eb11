"""Approvers told where they work: a tenant's Apprise channels (Slack, Teams, PagerDuty, ... by URL) get each new
and each escalated request's notice through the outbox, beside email.

Against a local HTTP receiver that records what each channel posted (Apprise's json:// and form:// services
pointed at it, as a Slack or Teams URL would be at theirs): the URL is stored sealed and never leaves in an event,
a failed channel is retried by the outbox and shows in the console, and no personal value reaches a channel
(the canary of the retention tests).
"""

import json
import threading
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs

import pytest
from django.urls import reverse
from django.utils import timezone

from tests.retention.test_retention_copies import ANNOUNCEMENT, CANARY
from tests.support.approvals_support import pending_request
from tests.support.issued_ids import call_labelled
from tests.support.operators import make_operator
from tools_app import approvals, outbox
from tools_app.access.roles import APPROVER, OPERATOR
from tools_app.conf import override_conf
from tools_app.models import (
    ApprovalRequest,
    ApprovalSettings,
    AuditEvent,
    NotificationChannel,
    OutboxEvent,
    OutboxStatus,
)

PUBLIC_URL = "https://ops.example.com"
SECRET = "T0KENsecret42"  # what a channel URL's path holds (a Slack token, an integration key)


class Receiver:
    """A local HTTP server that records every POST (path, content type, body) and fails the paths in `failing`."""

    def __init__(self):
        self.posts: list[dict] = []
        self.failing: set[str] = set()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
                receiver.posts.append({"path": self.path, "type": self.headers.get("Content-Type", ""), "body": body})
                self.send_response(500 if self.path in receiver.failing else 200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def url(self, scheme: str, path: str) -> str:
        return f"{scheme}://127.0.0.1:{self.port}{path}"

    def to(self, path: str) -> list[dict]:
        return [post for post in self.posts if post["path"] == path]


@pytest.fixture
def receiver(monkeypatch):
    for proxy in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(proxy, raising=False)
    server = Receiver()
    yield server
    server.server.shutdown()
    server.server.server_close()


@pytest.fixture
def operator(settings, tenant):
    override_conf(settings, public_url=PUBLIC_URL)
    alice = make_operator("alice", APPROVER, tenant)
    alice.email = "alice@example.invalid"
    alice.save()
    return make_operator("olga", OPERATOR, tenant)


def add_channel(operator, tenant, name: str, url: str, **fields) -> NotificationChannel:
    return outbox.save_channel(NotificationChannel(tenant=tenant, name=name, **fields), operator, url=url)


def announce(caller) -> ApprovalRequest:
    """An announcement (it needs approval) whose title and body carry the canary."""
    return pending_request(call_labelled(caller, "publish_announcement", ANNOUNCEMENT))


def channel_events() -> list[OutboxEvent]:
    return list(OutboxEvent.objects.filter(kind=outbox.CHANNEL_KIND).order_by("created_at"))


def test_a_new_request_reaches_each_channel_without_any_personal_value(caller, tenant, operator, receiver):
    add_channel(operator, tenant, "team json", receiver.url("json", f"/hooks/{SECRET}/json"))
    add_channel(operator, tenant, "team form", receiver.url("form", f"/hooks/{SECRET}/form"))
    add_channel(operator, tenant, "pager", receiver.url("json", f"/hooks/{SECRET}/pager"), escalations_only=True)
    request = announce(caller)
    assert CANARY in request.summary  # the console shows it whole; no channel does

    events = channel_events()
    assert len(events) == 2  # the pager hears only of escalations
    assert SECRET not in json.dumps([event.payload for event in events])  # the events name the channel, not its URL
    assert outbox.relay_batch().delivered == 3  # alice's email and the two channels

    [as_json] = receiver.to(f"/hooks/{SECRET}/json")
    [as_form] = receiver.to(f"/hooks/{SECRET}/form")
    posted = json.loads(as_json["body"])
    assert posted["title"].startswith("[idemops] Approval needed: Publish to staff: “[personal]”")
    link = f"{PUBLIC_URL}{reverse('admin:approval_link', args=[request.pk])}"  # the console's: nobody's own link
    assert link in posted["message"] and "/approval/decide/" not in posted["message"]
    assert parse_qs(as_form["body"])["title"] == [posted["title"]]
    assert CANARY not in json.dumps(receiver.posts)
    assert receiver.to(f"/hooks/{SECRET}/pager") == []


def test_an_escalation_reaches_the_escalation_channels_too(caller, tenant, operator, receiver):
    add_channel(operator, tenant, "team", receiver.url("json", "/team"))
    add_channel(operator, tenant, "pager", receiver.url("json", "/pager"), escalations_only=True)
    add_channel(operator, tenant, "off", receiver.url("json", "/off"), enabled=False)
    ApprovalSettings.objects.create(tenant=tenant, escalate_after_minutes=30)
    request = announce(caller)
    ApprovalRequest.objects.filter(pk=request.pk).update(created_at=timezone.now() - timedelta(minutes=31))

    assert approvals.escalate() == 1
    outbox.relay_batch()

    assert len(receiver.to("/team")) == 2 and receiver.to("/off") == []
    [paged] = receiver.to("/pager")
    assert json.loads(paged["body"])["title"].startswith("[idemops] ESCALATED: still waiting after 31 min")
    assert CANARY not in json.dumps(receiver.posts)


def test_a_failed_channel_is_retried_by_the_outbox_and_shows_in_the_console(client, caller, tenant, operator, receiver):
    channel = add_channel(operator, tenant, "flaky", receiver.url("json", f"/hooks/{SECRET}"))
    receiver.failing.add(f"/hooks/{SECRET}")
    announce(caller)

    report = outbox.relay_batch()

    assert (report.delivered, report.retried) == (1, 1)  # the email went; the channel waits for another attempt
    [event] = channel_events()
    assert (event.status, event.attempts) == (OutboxStatus.PENDING, 1)
    assert "500" in event.last_error or "Internal Server Error" in event.last_error, event.last_error
    assert SECRET not in event.last_error
    client.force_login(operator)
    listed = client.get(reverse("admin:tools_app_notificationchannel_changelist")).content.decode()
    assert "retrying (attempt 1)" in listed and SECRET not in listed
    assert "flaky" in listed and "json://127.0.0.1/…" in listed
    events_page = client.get(reverse("admin:tools_app_outboxevent_changelist")).content.decode()
    assert outbox.CHANNEL_KIND in events_page

    receiver.failing.clear()
    OutboxEvent.objects.filter(pk=event.pk).update(next_attempt_at=timezone.now())  # its backoff has passed
    assert outbox.relay_batch().delivered == 1

    event.refresh_from_db()
    assert (event.status, event.attempts) == (OutboxStatus.DELIVERED, 2)
    assert len(receiver.to(f"/hooks/{SECRET}")) == 2  # the failed attempt and the delivered one
    assert "delivered" in client.get(reverse("admin:tools_app_notificationchannel_changelist")).content.decode()
    assert channel.pk == event.payload["channel"]


def test_a_channel_is_added_in_the_console_sealed_and_never_shown_again(client, tenant, operator):
    client.force_login(operator)
    url = f"json://hooks.example.com/{SECRET}"

    added = client.post(reverse("admin:tools_app_notificationchannel_add"), {
        "tenant": tenant.pk, "name": "payments", "url": url, "enabled": "on"})

    assert added.status_code == 302, added.content.decode()[:2000]
    channel = NotificationChannel.objects.get()
    assert SECRET not in channel.sealed_url and channel.shown == "json://hooks.example.com/…"
    from tools_app.outbox import channels

    assert channels.urls_of([channel.pk]) == {channel.pk: url}
    page = client.get(reverse("admin:tools_app_notificationchannel_change", args=[channel.pk])).content.decode()
    assert SECRET not in page
    event = AuditEvent.objects.get(action="notification_channel.changed")
    assert SECRET not in json.dumps(event.after) and event.actor == "user:olga"

    kept = client.post(reverse("admin:tools_app_notificationchannel_change", args=[channel.pk]), {
        "tenant": tenant.pk, "name": "payments", "url": "", "escalations_only": "on", "enabled": "on"})
    assert kept.status_code == 302
    assert channels.urls_of([channel.pk]) == {channel.pk: url}  # empty: the URL is kept


def test_an_unknown_url_is_refused_and_a_person_without_the_permission_adds_nothing(client, tenant, operator):
    client.force_login(operator)
    refused = client.post(reverse("admin:tools_app_notificationchannel_add"), {
        "tenant": tenant.pk, "name": "bad", "url": "nosuchservice://x/y", "enabled": "on"})
    assert refused.status_code == 200 and "not an Apprise URL" in refused.content.decode()

    approver = make_operator("bob", APPROVER, tenant)
    client.force_login(approver)
    crafted = client.post(reverse("admin:tools_app_notificationchannel_add"), {
        "tenant": tenant.pk, "name": "sneaky", "url": "json://hooks.example.com/x", "enabled": "on"})
    assert crafted.status_code == 403
    assert not NotificationChannel.objects.exists()
