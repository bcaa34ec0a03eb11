"""Four eyes that can fire: the owner of an agent's token never approves what that agent asked for.

With a real token issued to a real user, an agent calling over MCP (the live server), and the
owner and another approver deciding in the admin (Django's test client, as a browser would post).
"""

import pytest
from django.urls import reverse

from idemops_demo.models import Announcement
from tests.support.issued_ids import call_labelled_sync
from tests.support.jobs import run_queued_jobs
from tests.support.mcp_client import error_of
from tests.support.operators import make_operator
from tools_app import access, approvals
from tools_app.access.roles import APPROVER
from tools_app.core.errors import Refused
from tools_app.models import ApprovalRequest, ApprovalStatus, AuditEvent

NOTE = {"title": "Maintenance", "body": "Down at 2am", "audience": "staff", "idempotency_key": "ann-1"}

pytestmark = pytest.mark.live


@pytest.fixture
def acme(transactional_db):
    return access.create_tenant("acme", "ACME")


@pytest.fixture
def olivia(acme):
    """An approver of acme, and the owner of acme's billing agent."""
    return make_operator("olivia", APPROVER, acme)


@pytest.fixture
def agent_token(acme, olivia):
    _, raw = access.issue_token(acme, "billing-agent", owner=olivia)
    return raw


def ask(web_server, token) -> ApprovalRequest:
    approval = error_of(call_labelled_sync(web_server.mcp_url, token, "publish_announcement", NOTE))["approval"]
    return ApprovalRequest.objects.get(pk=approval["request_id"])


def decide(client, user, request, action, reason):
    client.force_login(user)
    response = client.post(reverse("admin:tools_app_approvalqueue_act", args=[request.pk, action]),
                           {"reason": reason}, follow=True)
    return [str(m) for m in response.context["messages"]]


def test_the_owner_of_the_agent_cannot_approve_its_request_and_another_approver_can(
        web_server, client, acme, olivia, agent_token):
    request = ask(web_server, agent_token)
    assert (request.requested_by, request.requester_owner) == ("agent:acme/billing-agent", olivia)

    refused = decide(client, olivia, request, "approve", "looks fine to me")

    assert any("not done: four eyes: you own the agent that asked" in m for m in refused), refused
    request.refresh_from_db()
    assert (request.status, request.approvals) == (ApprovalStatus.PENDING, 0)
    event = AuditEvent.objects.get(action="approval.refused")
    assert (event.actor, event.after) == ("user:olivia", {"attempted": "approve"})
    assert "four eyes" in event.reason

    bob = make_operator("bob", APPROVER, acme)
    approved = decide(client, bob, request, "approve", "checked with the team")

    assert any("approved; it is being executed" in m for m in approved), approved
    run_queued_jobs()
    result = call_labelled_sync(web_server.mcp_url, agent_token, "publish_announcement", NOTE)
    assert not result.is_error and Announcement.objects.count() == 1
    assert ApprovalRequest.objects.get().decided_by == "user:bob"


def test_the_owner_may_still_reject_what_their_agent_asked(web_server, client, olivia, agent_token):
    request = ask(web_server, agent_token)

    rejected = decide(client, olivia, request, "reject", "my agent got the date wrong")

    assert any("rejected; it will not run" in m for m in rejected), rejected
    assert ApprovalRequest.objects.get().status == ApprovalStatus.REJECTED


def test_handing_the_agent_to_another_person_does_not_change_who_may_approve_what_it_already_asked(
        web_server, acme, olivia, agent_token):
    request = ask(web_server, agent_token)
    token = access.authenticate_token(agent_token)
    bob = make_operator("bob", APPROVER, acme)

    access.set_owner(token, bob, actor="user:root", reason="olivia moved teams")

    # the request keeps the owner from when it was made: olivia still may not, bob now may
    with pytest.raises(Refused, match="four eyes"):
        approvals.approve(request, olivia)
    assert approvals.approve(request, bob).status == ApprovalStatus.APPROVED
