"""A host built on the TypeScript SDK's client (tests/interop/confirm_client.mjs) has its person confirm a
deletion and decline a publication through elicitation/create on a stateful session (/mcp/session,
2025-11-25); a host declaring no elicitation gets the class and the confirmation page. Counted in the
database."""

import json
import subprocess

import pytest

from idemops_demo.models import Announcement, Order
from tests.support.mcp_client import call_sync
from tests.support.processes import WebServer
from tools_app.models import ApprovalRequest, Confirmation, IdempotencyRecord, Tenant

pytestmark = [pytest.mark.live, pytest.mark.conformance]

NOTE = {"title": "Maintenance", "body": "Down at 2am", "audience": "staff"}


@pytest.fixture(scope="module")
def confirming_web(django_db_setup, django_db_blocker):
    with django_db_blocker.unblock():
        server = WebServer("web-confirm-ts", IDEMOPS_MCP_USER_CONFIRMATION="true")
    yield server
    server.stop()


def host(interop, url: str, token: str, answer: str, tool: str, arguments: dict) -> dict:
    done = subprocess.run(["node", "confirm_client.mjs", url, token, answer, tool, json.dumps(arguments)],
                          cwd=interop, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def prepared(server, token, tool, arguments, label):
    result = call_sync(server.mcp_url, token, "prepare_operation",
                       {"tool": tool, "arguments": arguments, "idempotency_key": f"prep-{label}"})
    return result.structured_content["operation_id"]


def test_a_typescript_host_confirms_a_deletion_and_declines_a_publication(interop, confirming_web, token):
    session = f"{confirming_web.base_url}/mcp/session"
    order = Order.objects.create(tenant=Tenant.objects.get(slug="acme"), customer="Ada", currency="EUR", total="1")
    deletion = {"kind": "order", "id": order.pk, "reason": "duplicate"}
    key = prepared(confirming_web, token, "delete_record", deletion, "ts-del")

    confirmed = host(interop, session, token, "confirm", "delete_record", {**deletion, "idempotency_key": key})
    assert confirmed["shown"] == [f"Confirm this operation: Delete order #{order.pk}. Reason: duplicate"]
    assert confirmed["structured"]["error"]["class"] == "pending_approval"  # on to the operators' approval

    key = prepared(confirming_web, token, "publish_announcement", NOTE, "ts-pub")
    declined = host(interop, session, token, "decline", "publish_announcement", {**NOTE, "idempotency_key": key})
    assert declined["structured"]["error"]["class"] == "confirmation_declined"
    replay = host(interop, session, token, "confirm", "publish_announcement", {**NOTE, "idempotency_key": key})
    assert replay["shown"] == [] and replay["structured"]["error"]["class"] == "confirmation_declined"

    note = {**NOTE, "title": "Unasked"}
    key = prepared(confirming_web, token, "publish_announcement", note, "ts-none")
    unasked = host(interop, confirming_web.mcp_url, token, "none", "publish_announcement",
                   {**note, "idempotency_key": key})
    assert unasked["structured"]["error"]["class"] == "confirmation_required"
    assert unasked["structured"]["error"]["elicitation"]["mode"] == "url"

    assert Announcement.objects.count() == 0 and ApprovalRequest.objects.filter(tool="delete_record").count() == 1
    assert IdempotencyRecord.objects.filter(error_class="confirmation_declined").count() == 1
    assert sorted(Confirmation.objects.values_list("status", flat=True)) == ["accepted", "declined", "pending"]
