"""make run's banner, pasted as a new operator would: its calls work against the live server, and the
payment it suggests waits in the approval queue with its approver emailed."""

import json
import re

import pytest

from tests.support.mcp_client import answer_of, post_raw
from tests.support.operators import make_operator
from tools_app.access.roles import APPROVER
from tools_app.approvals.thresholds import needs_step_up
from tools_app.management.commands.serve import banner
from tools_app.management.demo import DEMO_STEP_UP_AMOUNT
from tools_app.models import ApprovalRequest, ApprovalSettings, ApprovalStatus, OutboxEvent, Tenant

pytestmark = pytest.mark.live


def pasted(text: str) -> list[dict]:
    """The JSON-RPC bodies of the banner's curl commands, in order."""
    return [json.loads(body) for body in re.findall(r"-d '(\{.*\})'$", text, re.MULTILINE)]


def test_the_banners_calls_work_and_its_payment_waits_for_the_approver_who_is_emailed(web_server, token):
    acme = Tenant.objects.get(slug="acme")
    ApprovalSettings.objects.create(tenant=acme, payment_threshold=1000,  # as the demo tenant has
                                    step_up_amount=DEMO_STEP_UP_AMOUNT)
    alice = make_operator("alice", APPROVER, acme)
    alice.email = "alice@example.invalid"
    alice.save()
    text = banner(web_server.base_url, {"admin_user": "admin", "token": token})
    order, prepare, payment = pasted(text)
    assert "not idempotency.operation_id" in text and f"step-up amount ({DEMO_STEP_UP_AMOUNT:,} EUR)" in text

    ordered = answer_of(post_raw(web_server.mcp_url, token, order))["result"]
    prepared = answer_of(post_raw(web_server.mcp_url, token, prepare))["result"]
    payment["params"]["arguments"]["idempotency_key"] = prepared["structuredContent"]["operation_id"]
    paid = answer_of(post_raw(web_server.mcp_url, token, payment))["result"]

    assert not ordered["isError"] and not prepared["isError"]
    assert paid["structuredContent"]["error"]["class"] == "pending_approval"
    request = ApprovalRequest.objects.get(tool="request_payment")
    assert request.status == ApprovalStatus.PENDING
    assert needs_step_up(request)  # approving it asks alice for a fresh code, as the banner says
    # (the recipient is stored encrypted, core.personal: chosen among the events as read, not by SQL)
    emails = [event for event in OutboxEvent.objects.filter(kind="notification.email")
              if event.payload["recipient"] == "alice@example.invalid"]
    assert len(emails) == 1
