"""Approval end to end: the agent over MCP (real uvicorn, the SDK's client), the operator in the admin
(Django's test client), the execution in a real django-q2 cluster."""

import time

import pytest
from django.urls import reverse
from django.utils import timezone

from idemops_demo.models import Announcement, Order
from tests.support.issued_ids import call_labelled_sync
from tests.support.mcp_client import call_sync, error_of
from tests.support.operators import make_operator
from tests.support.processes import JobCluster
from tools_app import approvals
from tools_app.access.roles import APPROVER
from tools_app.models import ApprovalRequest, ApprovalStatus, AuditEvent, Tenant

pytestmark = pytest.mark.live

QUEUE = reverse("admin:tools_app_approvalqueue_changelist")
NOTE = {"title": "Maintenance", "body": "Down at 2am", "audience": "staff"}


@pytest.fixture
def job_cluster(transactional_db):
    cluster = JobCluster()
    yield cluster
    cluster.stop()


@pytest.fixture
def bob(token):
    return make_operator("bob", APPROVER, Tenant.objects.get(slug="acme"))


def until(condition, timeout=60.0, what="the condition"):
    """Poll `condition` until it returns something truthy."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_request_pending_approve_in_the_admin_executed_once_and_the_retry_returns_the_result(
        web_server, token, bob, client, job_cluster):
    url, args = web_server.mcp_url, {**NOTE, "idempotency_key": "ann-1"}

    # an agent asks: nothing runs, it gets a request id, a summary and an expiry
    first = call_labelled_sync(url, token, "publish_announcement", args)
    pending = error_of(first)
    request_id = pending["approval"]["request_id"]
    assert pending["class"] == "pending_approval" and pending["approval"]["status"] == "pending"
    assert pending["approval"]["summary"] == "Publish to staff: “Maintenance” (11 characters)"
    assert first.structured_content["idempotency"]["status"] == "awaiting_approval"
    # the same call again: the same request; other arguments: conflict
    again = call_labelled_sync(url, token, "publish_announcement", args)
    assert error_of(again)["approval"]["request_id"] == request_id and again.meta["io.idemops/replayed"] is True
    other = call_labelled_sync(url, token, "publish_announcement", {**args, "body": "Down at 3am"})
    assert error_of(other)["class"] == "conflict" and error_of(other)["differing_fields"] == ["body"]

    # an approver approves it in the admin's queue
    client.force_login(bob)
    assert request_id in [r.pk for r in client.get(QUEUE).context["cl"].result_list]
    approved = client.post(QUEUE, {"action": "approve", "_selected_action": [request_id], "index": "0",
                                   "confirm": "yes", "reason": ""}, follow=True)
    assert request_id not in [r.pk for r in approved.context["cl"].result_list]

    # the cluster executes it; the agent's retry with the same key gets the result
    result = until(lambda: (r := call_labelled_sync(url, token, "publish_announcement", args)) and not r.is_error and r,
                   what="the approved call's result")
    announcement = Announcement.objects.get()
    assert result.structured_content["announcement_id"] == announcement.pk
    assert result.structured_content["idempotency"]["replayed"] is True
    status = until(lambda: (s := call_sync(url, token, "get_approval_status", {"request_id": request_id}))
                   .structured_content["status"] == "executed" and s, what="the request to settle")
    assert status.structured_content["result"]["announcement_id"] == announcement.pk
    listed = call_sync(url, token, "list_announcements", {})
    assert [a["announcement_id"] for a in listed.structured_content["announcements"]] == [announcement.pk]
    assert AuditEvent.objects.filter(action="record.succeeded", object_id=str(announcement.record_id)).count() == 1


def test_a_rejected_deletion_deletes_nothing_and_the_retry_says_why(web_server, token, bob, client):
    url = web_server.mcp_url
    order = call_sync(url, token, "create_order", {
        "customer": "ACME", "currency": "EUR", "items": [{"sku": "A", "quantity": 1, "unit_price": "9.99"}],
        "idempotency_key": "o-1"}).structured_content
    args = {"kind": "order", "id": order["order_id"], "reason": "duplicate", "idempotency_key": "del-1"}
    pending = error_of(call_labelled_sync(url, token, "delete_record", args))
    assert pending["class"] == "pending_approval"
    assert pending["approval"]["summary"] == (f"Delete order #{order['order_id']} of ACME, 9.99 EUR, 1 line. "
                                              "Reason: duplicate")

    client.force_login(bob)
    act = reverse("admin:tools_app_approvalqueue_act", args=[pending["approval"]["request_id"], "reject"])
    assert client.post(act, {"reason": ""}).status_code == 200  # the form again: a reason is required
    assert client.post(act, {"reason": "it is not a duplicate"}).status_code == 302

    retry = error_of(call_labelled_sync(url, token, "delete_record", args))
    assert retry["class"] == "permission_denied" and "it is not a duplicate" in retry["message"]
    assert Order.objects.filter(pk=order["order_id"]).exists()
    assert not call_sync(url, token, "get_order", {"order_id": order["order_id"]}).is_error


def test_an_unanswered_request_expires_and_the_retry_says_so(web_server, token):
    url, args = web_server.mcp_url, {**NOTE, "idempotency_key": "ann-2"}
    request_id = error_of(call_labelled_sync(url, token, "publish_announcement", args))["approval"]["request_id"]
    ApprovalRequest.objects.filter(pk=request_id).update(expires_at=timezone.now())

    approvals.sweep()  # what the approvals.sweep schedule runs each minute

    retry = error_of(call_labelled_sync(url, token, "publish_announcement", args))
    assert retry["class"] == "permission_denied" and "expired" in retry["message"]
    status = call_sync(url, token, "get_approval_status", {"request_id": request_id}).structured_content
    assert status["status"] == "expired" and status["error"]["class"] == "permission_denied"
    assert ApprovalRequest.objects.get().status == ApprovalStatus.EXPIRED and Announcement.objects.count() == 0
