"""One-click approval links: each approver's message carries a link of their own (signed, bound to the request and
the person, expiring with the request, used once) that opens the decision after the login and the second factor.

Every refusal is a crafted request to the console (the test client, real PostgreSQL): a used, expired, forwarded
or altered link is answered 403 with its message, audited, and changes nothing (no decision row, the request still
pending, the link unused), counted in the database.
"""

import re
from datetime import timedelta
from decimal import Decimal

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from django.utils.html import escape

from tests.support.approvals_support import STAFF_NOTE, call, pending_request
from tests.support.operators import PASSWORD, current_code, make_operator, verify_session
from tools_app.access.roles import APPROVER
from tools_app.approvals import links
from tools_app.conf import override_conf
from tools_app.models import (
    ApprovalDecision,
    ApprovalLink,
    ApprovalRequest,
    ApprovalSettings,
    ApprovalStatus,
    AuditEvent,
    OutboxEvent,
)

PUBLIC_URL = "https://ops.example.com"


@pytest.fixture
def people(settings, tenant):
    override_conf(settings, public_url=PUBLIC_URL)
    team = {}
    for name in ("alice", "carol"):
        user = make_operator(name, APPROVER, tenant)
        user.email = f"{name}@example.invalid"
        user.save()
        team[name] = user
    return team


def link_for(email: str, request: ApprovalRequest) -> str:
    """The path of the link in `email`'s latest message about `request`."""
    # (the recipient is stored encrypted, core.personal: chosen among the events as read, not by SQL)
    events = OutboxEvent.objects.filter(record_id=request.record_id, kind="notification.email").order_by("-created_at")
    body = next(event for event in events if event.payload["recipient"] == email).payload["body"]
    [url] = re.findall(r"https://ops\.example\.com(/\S+)", body)
    return url


def unchanged(request: ApprovalRequest) -> bool:
    request.refresh_from_db()
    return (request.status == ApprovalStatus.PENDING and request.approvals == 0
            and not ApprovalDecision.objects.filter(request=request).exists()
            and not ApprovalLink.objects.filter(request=request, used_at__isnull=False).exists())


def announcement(caller, key="a-1") -> ApprovalRequest:
    return pending_request(call(caller, "publish_announcement", idempotency_key=key, **STAFF_NOTE))


def refusals() -> list[str]:
    refused = AuditEvent.objects.filter(action="approval_link.refused").order_by("id")
    return list(refused.values_list("reason", flat=True))


def test_each_approver_gets_a_link_of_their_own_that_opens_the_decision_and_decides_once(client, caller, people):
    request = announcement(caller)
    alices, carols = link_for("alice@example.invalid", request), link_for("carol@example.invalid", request)
    assert alices != carols and alices.startswith(reverse("admin:approval_decide", args=["x"])[:-2])
    assert ApprovalLink.objects.filter(request=request).count() == 2
    assert all(len(row.digest) == 64 for row in ApprovalLink.objects.all())
    assert not ApprovalLink.objects.filter(digest__in=[alices, carols]).exists()  # the token itself is not stored

    client.force_login(people["alice"])
    page = client.get(alices)
    assert page.status_code == 200
    assert "Publish to staff" in page.content.decode() and 'value="approve"' in page.content.decode()
    assert unchanged(request)  # opening decides nothing

    done = client.post(alices, {"verdict": "approve", "reason": "checked"})

    assert done.status_code == 200 and "Approved" in done.content.decode()
    request.refresh_from_db()
    assert request.status == ApprovalStatus.APPROVED and request.decided_by == "user:alice"
    assert ApprovalDecision.objects.filter(request=request, user=people["alice"], verdict="approve").count() == 1
    used = ApprovalLink.objects.get(request=request, user=people["alice"])
    assert used.used_at is not None and used.used_for == "approve"
    assert AuditEvent.objects.filter(action="approval_link.used", object_id=str(used.pk)).count() == 1

    again = client.post(alices, {"verdict": "approve"})
    assert again.status_code == 403 and escape(links.USED) in again.content.decode()
    assert ApprovalDecision.objects.filter(request=request).count() == 1


def test_a_used_link_is_refused_even_for_the_other_verdict_and_changes_nothing(client, caller, people):
    request = announcement(caller)
    path = link_for("alice@example.invalid", request)
    client.force_login(people["alice"])
    assert client.post(path, {"verdict": "reject", "reason": "not now"}).status_code == 200
    request.refresh_from_db()
    assert request.status == ApprovalStatus.REJECTED

    for verdict in ("approve", "reject"):
        answer = client.post(path, {"verdict": verdict, "reason": "again"})
        assert answer.status_code == 403 and escape(links.USED) in answer.content.decode()
    assert client.get(path).status_code == 403
    assert ApprovalDecision.objects.filter(request=request).count() == 1
    assert len(refusals()) == 3


def test_a_forwarded_link_is_refused_to_another_approver_and_changes_nothing(client, caller, people):
    request = announcement(caller)
    alices = link_for("alice@example.invalid", request)
    client.force_login(people["carol"])  # carol may approve this request: just not through alice's link

    opened = client.get(alices)
    posted = client.post(alices, {"verdict": "approve", "reason": "forwarded to me"})

    assert opened.status_code == 403 and posted.status_code == 403
    assert escape(links.FORWARDED) in posted.content.decode()
    assert unchanged(request)
    assert len(refusals()) == 2 and all("another person" in reason for reason in refusals())
    assert AuditEvent.objects.filter(action="approval_link.refused", actor="user:carol").count() == 2


@pytest.mark.parametrize("alter", [
    pytest.param(lambda token: token[:-1] + ("A" if token[-1] != "A" else "B"), id="signature"),
    pytest.param(lambda token: ("A" if token[0] != "A" else "B") + token[1:], id="payload"),
    pytest.param(lambda token: token.split(":")[0] + ":" + token.split(":", 1)[1][::-1], id="shuffled"),
    pytest.param(lambda token: "not-a-link", id="made-up"),
])
def test_an_altered_link_is_refused_and_changes_nothing(client, caller, people, alter):
    request = announcement(caller)
    token = link_for("alice@example.invalid", request).rstrip("/").rsplit("/", 1)[1]
    altered = reverse("admin:approval_decide", args=[alter(token)])
    client.force_login(people["alice"])

    answer = client.post(altered, {"verdict": "approve"})

    assert answer.status_code == 403 and escape(links.NOT_VALID) in answer.content.decode()
    assert unchanged(request) and len(refusals()) == 1


def test_a_signed_token_whose_row_is_not_the_one_it_names_is_refused(client, caller, people):
    """A token signed with the server's key (as only the server can) for a link that was never issued."""
    from django.core import signing

    request = announcement(caller)
    forged = signing.dumps({"r": request.pk, "u": people["carol"].pk, "e": 0, "n": "x"}, salt=links.SALT)
    client.force_login(people["carol"])

    answer = client.post(reverse("admin:approval_decide", args=[forged]), {"verdict": "approve"})

    assert answer.status_code == 403 and escape(links.NOT_VALID) in answer.content.decode()
    assert unchanged(request)


def test_an_expired_link_is_refused_and_changes_nothing(client, caller, people):
    request = announcement(caller)
    path = link_for("alice@example.invalid", request)
    ApprovalLink.objects.filter(request=request).update(expires_at=timezone.now() - timedelta(seconds=1))
    client.force_login(people["alice"])

    answer = client.post(path, {"verdict": "approve"})

    assert answer.status_code == 403 and escape(links.EXPIRED) in answer.content.decode()
    assert unchanged(request)


def test_the_link_asks_for_the_login_then_the_second_factor_then_opens(caller, people):
    request = announcement(caller)
    path = link_for("alice@example.invalid", request)
    browser = Client()

    to_login = browser.get(path)
    assert to_login.status_code == 302 and to_login["Location"].startswith(reverse("admin:login"))
    logged_in = browser.post(to_login["Location"], {"username": "alice", "password": PASSWORD, "next": path})
    assert logged_in.status_code == 302 and logged_in["Location"] == path

    to_code = browser.get(path)  # a password alone: the second factor first
    assert to_code.status_code == 302 and to_code["Location"].startswith(reverse("admin:second_factor"))
    assert browser.post(path, {"verdict": "approve"}).status_code == 302
    assert unchanged(request)

    back = browser.post(to_code["Location"], {"code": current_code(people["alice"]), "next": path})
    assert back.status_code == 302 and back["Location"] == path
    assert browser.post(path, {"verdict": "approve", "reason": "ok"}).status_code == 200
    request.refresh_from_db()
    assert request.status == ApprovalStatus.APPROVED


def test_step_up_asks_for_a_fresh_code_and_the_link_still_works_after_it(settings, client, caller, tenant, people):
    override_conf(settings, step_up_minutes=10)
    ApprovalSettings.objects.create(tenant=tenant, payment_threshold=Decimal("100"),
                                    step_up_amount=Decimal("1000"), threshold_currency="EUR")
    request = pending_request(call(caller, "request_payment", amount="5000.00", currency="EUR", payee="ACME",
                                   idempotency_key="p-big"))
    path = link_for("alice@example.invalid", request)
    client.force_login(people["alice"], second_factor=False)
    verify_session(client, people["alice"], at=timezone.now() - timedelta(minutes=11))

    asked = client.post(path, {"verdict": "approve", "reason": "invoice checked"})

    assert asked.status_code == 302 and "stale=1" in asked["Location"]
    assert unchanged(request)  # the link's use rolled back with the refused decision
    refusal = AuditEvent.objects.get(action="approval.refused", object_id=str(request.pk))
    assert refusal.reason.startswith("step-up:")

    assert client.post(asked["Location"], {"code": current_code(people["alice"]), "next": path}).status_code == 302
    assert client.post(path, {"verdict": "approve", "reason": "invoice checked"}).status_code == 200
    request.refresh_from_db()
    assert request.status == ApprovalStatus.APPROVED
    assert ApprovalLink.objects.get(request=request, user=people["alice"]).used_for == "approve"


def test_a_decision_the_rules_refuse_leaves_the_link_unused(client, caller, people):
    request = announcement(caller)
    path = link_for("alice@example.invalid", request)
    client.force_login(people["alice"])

    answer = client.post(path, {"verdict": "reject", "reason": "  "})  # a rejection needs a reason

    assert answer.status_code == 409 and "needs a reason" in answer.content.decode()
    assert unchanged(request)
    assert client.post(path, {"verdict": "reject", "reason": "wrong audience"}).status_code == 200


def test_an_escalation_sends_new_links_and_the_escalation_address_gets_the_console_link(caller, tenant, people):
    from tools_app import approvals

    ApprovalSettings.objects.create(tenant=tenant, escalate_after_minutes=30, escalation_email="lead@example.invalid")
    request = announcement(caller)
    first = link_for("alice@example.invalid", request)
    ApprovalRequest.objects.filter(pk=request.pk).update(created_at=timezone.now() - timedelta(minutes=31))

    assert approvals.escalate() == 1

    assert link_for("alice@example.invalid", request) != first
    assert ApprovalLink.objects.filter(request=request).count() == 4  # alice and carol, twice
    assert link_for("lead@example.invalid", request) == reverse("admin:approval_link", args=[request.pk])
