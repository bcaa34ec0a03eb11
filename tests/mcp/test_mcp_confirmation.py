"""The person behind the agent confirms through their MCP host (tools_app.approvals.confirmations).

A real web server (uvicorn, confirmation on as deployed), the official Python SDK's client as the
host, with an elicitation callback that confirms, declines, or is bypassed by a host that tampers
with the request state; at 2026-07-28 (input-required rounds on stateless /mcp) and 2025-11-25
(elicitation/create on a stateful /mcp/session). Counted in the database.
"""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import ElicitResult, Implementation, InputRequiredResult

from idemops_demo.models import Announcement, Order
from tests.support.mcp_client import call_sync
from tests.support.operators import agent_owner, make_operator
from tests.support.processes import WebServer
from tools_app import access, approvals
from tools_app.access.roles import APPROVER
from tools_app.models import ApprovalRequest, AuditEvent, Confirmation, IdempotencyRecord, Tenant

pytestmark = pytest.mark.live

MODERN, LEGACY = "2026-07-28", "2025-11-25"
NOTE = {"title": "Maintenance", "body": "Down at 2am", "audience": "staff"}


@pytest.fixture(scope="module")
def confirming_web(django_db_setup, django_db_blocker):
    with django_db_blocker.unblock():
        server = WebServer("web-confirm", IDEMOPS_MCP_USER_CONFIRMATION="true")
    yield server
    server.stop()


class Host:
    """A scripted MCP host: its person's answer, and what it was shown."""

    def __init__(self, confirm: bool | None):
        self.confirm = confirm
        self.shown: list[str] = []

    async def __call__(self, context, params) -> ElicitResult:
        self.shown.append(params.message)
        if self.confirm is None:
            return ElicitResult(action="decline")
        return ElicitResult(action="accept", content={"confirm": self.confirm})


def client(url: str, token: str, version: str, host: Host | None, http: httpx2.AsyncClient) -> Client:
    mode = version if version == MODERN else "legacy"
    return Client(streamable_http_client(url, http_client=http), mode=mode, elicitation_callback=host,
                  client_info=Implementation(name="scripted-host", version="1.0"))


async def _call(url, token, version, host, tool, arguments):
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=30) as http:
        async with client(url, token, version, host, http) as c:
            return await c.call_tool(tool, arguments)


def call(url, token, version, host, tool, arguments):
    return asyncio.run(_call(url, token, version, host, tool, arguments))


def url_for(server: WebServer, version: str) -> str:
    return server.mcp_url if version == MODERN else f"{server.base_url}/mcp/session"


def prepared(server: WebServer, token: str, tool: str, arguments: dict[str, Any], label: str) -> str:
    result = call_sync(server.mcp_url, token, "prepare_operation",
                       {"tool": tool, "arguments": arguments, "idempotency_key": f"prep-{label}"})
    assert not result.is_error, result.structured_content
    return result.structured_content["operation_id"]


def approve_and_run(request_id: int, approver) -> None:
    request = ApprovalRequest.objects.get(pk=request_id)
    approvals.approve(request, approver)
    approvals.run_approved(request_id)


@pytest.mark.parametrize("version", [MODERN, LEGACY])
def test_a_host_confirms_a_deletion_and_declines_a_publication(confirming_web, token, version):
    acme = Tenant.objects.get(slug="acme")
    bob = make_operator("bob", APPROVER, acme)
    order = Order.objects.create(tenant=acme, customer="Ada Lovelace", currency="EUR", total="12.00")
    url = url_for(confirming_web, version)

    # the deletion: the host shows its person the summary (only what the agent sent), they confirm
    deletion = {"kind": "order", "id": order.pk, "reason": "duplicate"}
    key = prepared(confirming_web, token, "delete_record", deletion, f"del-{version}")
    host = Host(confirm=True)
    first = call(url, token, version, host, "delete_record", {**deletion, "idempotency_key": key})
    assert host.shown == [f"Confirm this operation: Delete order #{order.pk}. Reason: duplicate"]
    assert "Ada" not in host.shown[0]
    # confirmed: the call went on to the operators' approval (delete_record also needs one)
    pending = first.structured_content["error"]
    assert pending["class"] == "pending_approval", pending
    approve_and_run(pending["approval"]["request_id"], bob)
    assert not Order.objects.filter(pk=order.pk).exists()
    # a retry with the key replays without asking again
    again = call(url, token, version, Host(confirm=False), "delete_record", {**deletion, "idempotency_key": key})
    assert not again.is_error and again.structured_content["deleted"] is True
    assert again.structured_content["idempotency"]["replayed"] is True

    # the publication: its person declines (an accepted form left unchecked, and a plain decline)
    for label, answer in (("a", False), ("b", None)):
        note = {**NOTE, "title": f"Maintenance {label}"}
        key = prepared(confirming_web, token, "publish_announcement", note, f"pub-{version}-{label}")
        declined = call(url, token, version, Host(confirm=answer), "publish_announcement",
                        {**note, "idempotency_key": key})
        error = declined.structured_content["error"]
        assert error["class"] == "confirmation_declined", error
        assert declined.structured_content["idempotency"]["status"] == "failed"
        # final: its replay says so, and asks nobody
        host = Host(confirm=True)
        replay = call(url, token, version, host, "publish_announcement", {**note, "idempotency_key": key})
        assert replay.structured_content["error"]["class"] == "confirmation_declined", replay.structured_content
        assert host.shown == []
        assert replay.structured_content["idempotency"]["replayed"] is True

    # counted: one deletion, no publication, no approval asked for a declined call
    assert Announcement.objects.count() == 0
    assert ApprovalRequest.objects.filter(tool="publish_announcement").count() == 0
    assert IdempotencyRecord.objects.filter(tool="publish_announcement", status="failed",
                                            error_class="confirmation_declined").count() == 2
    rows = Confirmation.objects.order_by("pk")
    assert [(r.tool, r.status) for r in rows] == [("delete_record", "accepted"), ("publish_announcement", "declined"),
                                                  ("publish_announcement", "declined")]
    assert all(r.host == "scripted-host 1.0" for r in rows)
    # the audit log: who confirmed what, through which host
    confirmed = AuditEvent.objects.get(action="confirmation.confirmed")
    assert confirmed.actor == "agent:acme/agent" and confirmed.after["host"] == "scripted-host 1.0"
    assert confirmed.after["summary"] == f"Delete order #{order.pk}. Reason: duplicate"
    assert AuditEvent.objects.filter(action="confirmation.declined").count() == 2


# --- a host that tampers (2026-07-28: it drives the rounds itself) -----------------------------------


async def _rounds(url, token, tool, arguments, tamper):
    """Call, get the input-required result, then answer `confirm` the way `tamper` rewrites it."""
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=30) as http:
        async with client(url, token, MODERN, Host(confirm=True), http) as c:
            first = await c.session.call_tool(tool, arguments, allow_input_required=True)
            assert isinstance(first, InputRequiredResult), first
            responses = {k: ElicitResult(action="accept", content={"confirm": True}) for k in first.input_requests}
            sends = await asyncio.to_thread(tamper, arguments, first.request_state)  # it may read the database
            answers = []
            for args, state in sends:
                try:
                    answers.append(await c.session.call_tool(tool, args, input_responses=responses,
                                                             request_state=state, allow_input_required=True))
                except MCPError as refused:
                    answers.append(refused)
            return answers


def flipped(state: str) -> str:
    raw = bytearray(base64.urlsafe_b64decode(state[3:] + "=" * (-len(state[3:]) % 4)))
    raw[-1] ^= 1
    return "v1." + base64.urlsafe_b64encode(bytes(raw)).decode().rstrip("=")


def refused(answer) -> bool:
    """Refused by the SDK's boundary (-32602) or by the confirmation row (confirmation_refused)."""
    if isinstance(answer, MCPError):
        return answer.error.code == -32602
    return answer.is_error and answer.structured_content["error"]["class"] == "confirmation_refused"


def test_every_tampered_confirmation_is_refused_and_nothing_runs(confirming_web, token):
    url = confirming_web.mcp_url
    note = {**NOTE, "title": "Tampered"}
    key = prepared(confirming_web, token, "publish_announcement", note, "tamper")
    arguments = {**note, "idempotency_key": key}

    # a flipped bit of the sealed state; the state of another call (other arguments); a forged plaintext
    answers = asyncio.run(_rounds(url, token, "publish_announcement", arguments, lambda args, state: [
        (args, flipped(state)),
        ({**args, "body": "Down at 3am"}, state),
        (args, json.dumps({"v": 1, "confirmation": str(Confirmation.objects.get().token)})),
    ]))
    assert all(refused(a) for a in answers), answers

    # used twice: the first answer is taken, the second refused
    twice = asyncio.run(_rounds(url, token, "publish_announcement", arguments, lambda args, state: [
        (args, state), (args, state)]))
    assert twice[0].structured_content["error"]["class"] == "pending_approval", twice[0]
    assert refused(twice[1]), twice[1]

    # after its deadline: refused
    note2 = {**NOTE, "title": "Late"}
    key2 = prepared(confirming_web, token, "publish_announcement", note2, "late")

    def late(args, state):
        Confirmation.objects.filter(status="pending").update(expires_at="2000-01-01T00:00:00Z")
        return [(args, state)]

    assert refused(asyncio.run(_rounds(url, token, "publish_announcement", {**note2, "idempotency_key": key2},
                                       late))[0])
    assert Announcement.objects.count() == 0
    assert ApprovalRequest.objects.count() == 1  # only the honest answer reached the engine
    assert AuditEvent.objects.filter(action="confirmation.refused").count() >= 2


def test_another_principal_cannot_use_a_confirmation(confirming_web, token):
    """The state another agent's call was given is refused for this one (the boundary's principal binding)."""
    _, second_agent = access.issue_token(Tenant.objects.get(slug="acme"), "second-agent", owner=agent_owner())
    note = {**NOTE, "title": "Theirs"}
    key = prepared(confirming_web, token, "publish_announcement", note, "theirs")
    arguments = {**note, "idempotency_key": key}
    stolen: list[str] = []
    asyncio.run(_rounds(confirming_web.mcp_url, token, "publish_announcement", arguments,
                        lambda args, state: stolen.append(state) or []))
    [answer] = asyncio.run(_rounds(confirming_web.mcp_url, second_agent, "publish_announcement", arguments,
                                   lambda args, state: [(args, stolen[0])]))
    assert refused(answer)
    assert Announcement.objects.count() == 0 and ApprovalRequest.objects.count() == 0


@pytest.mark.parametrize("version", [MODERN, LEGACY])
def test_a_host_that_cannot_ask_gets_the_class_and_the_confirmation_page(confirming_web, token, version, client):
    note = {**NOTE, "title": f"Page {version}"}
    key = prepared(confirming_web, token, "publish_announcement", note, f"page-{version}")
    # no elicitation capability (and at 2025-11-25, stateless /mcp cannot ask mid-call either)
    first = call(confirming_web.mcp_url, token, version, None, "publish_announcement", {**note, "idempotency_key": key})
    error = first.structured_content["error"]
    assert error["class"] == "confirmation_required" and "idempotency" not in first.structured_content
    link = error["confirmation"]["url"]
    assert error["elicitation"] == {"mode": "url", "url": link, "elicitationId": error["confirmation"]["id"],
                                    "message": f"Confirm this operation: Publish to staff: “{note['title']}” "
                                               "(11 characters)"}
    assert IdempotencyRecord.objects.filter(tool="publish_announcement").count() == 0  # nothing claimed
    path = link.removeprefix(confirming_web.base_url)

    # behind the person's login: anonymous is sent to log in; another person does not find it
    assert client.get(path).status_code == 302
    client.force_login(make_operator("mallory", APPROVER, Tenant.objects.get(slug="acme")))
    assert client.post(path, {"decision": "confirm"}).status_code == 404
    # the person the agent acts for confirms, once
    client.force_login(agent_owner())
    assert client.post(path, {"decision": "confirm"}).status_code == 200
    assert client.post(path, {"decision": "decline"}).status_code == 409
    # the agent calls again with the key: it runs (into the operators' approval)
    again = call(confirming_web.mcp_url, token, version, None, "publish_announcement",
                 {**note, "idempotency_key": key})
    assert again.structured_content["error"]["class"] == "pending_approval", again.structured_content
    assert Confirmation.objects.get().status == "accepted"
