"""One-click approval links over real HTTP: the agent asks over MCP (real uvicorn), the approvers' links are
crafted into requests to the same server by logged-in sessions (password and authenticator code), counted
in PostgreSQL: a forwarded or altered link changes nothing, and the same link posted twice at once decides once."""

import re
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.support.issued_ids import call_labelled_sync
from tests.support.mcp_client import error_of
from tests.support.operators import admin_session, login_for_the_web_server, make_operator
from tools_app.access.roles import APPROVER
from tools_app.models import ApprovalDecision, ApprovalRequest, ApprovalStatus, AuditEvent, OutboxEvent, Tenant

pytestmark = pytest.mark.live

NOTE = {"title": "Maintenance", "body": "Down at 2am", "audience": "staff", "idempotency_key": "ann-links"}


def approver(name: str):
    user = make_operator(name, APPROVER, Tenant.objects.get(slug="acme"))
    user.email = f"{name}@example.invalid"
    user.save(update_fields=["email"])
    login_for_the_web_server(user)
    return user


def link_of(email: str, request_id: int) -> str:
    # (the recipient is stored encrypted, core.personal: chosen among the events as read, not by SQL)
    [body] = [event.payload["body"] for event in OutboxEvent.objects.filter(
        kind="notification.email", record__approval__pk=request_id) if event.payload["recipient"] == email]
    return re.search(r"/admin/approval/decide/[^/\s]+/", body).group(0)


def post(session, path: str, **data):
    return session.post(path, data={"csrfmiddlewaretoken": session.cookies["csrftoken"], **data})


def test_crafted_requests_with_a_forwarded_an_altered_and_a_doubly_posted_link(web_server, token):
    approver("alice"), approver("carol")
    request_id = error_of(call_labelled_sync(web_server.mcp_url, token, "publish_announcement", NOTE)
                          )["approval"]["request_id"]
    alices = link_of("alice@example.invalid", request_id)
    alice, carol = admin_session(web_server, "alice"), admin_session(web_server, "carol")

    forwarded = post(carol, alices, verdict="approve", reason="forwarded to me")
    altered = post(alice, alices[:-3] + ("x" if alices[-3] != "x" else "y") + alices[-2:], verdict="approve")

    assert forwarded.status_code == 403 and "sent to another person" in forwarded.text
    assert altered.status_code == 403 and "This link is not valid" in altered.text
    assert not ApprovalDecision.objects.filter(request_id=request_id).exists()
    assert ApprovalRequest.objects.get(pk=request_id).status == ApprovalStatus.PENDING

    # the same link, posted twice at once: one decision
    with ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(lambda _: post(alice, alices, verdict="approve", reason="checked"), range(2)))

    assert sorted(answer.status_code for answer in answers) == [200, 403]
    assert ApprovalDecision.objects.filter(request_id=request_id).count() == 1
    assert AuditEvent.objects.filter(action="approval_link.used").count() == 1
    assert ApprovalRequest.objects.get(pk=request_id).status == ApprovalStatus.APPROVED
    assert post(alice, alices, verdict="reject", reason="too late").status_code == 403
