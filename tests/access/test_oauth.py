"""Agents by OAuth 2.1 against the live server: an MCP host registers, its person consents in the console
(with their second factor) choosing the tenant and scopes, the host exchanges the code with its PKCE
verifier and calls a write tool with the token, which is the person's (four eyes). Refresh rotates,
revocation ends it, and every refused case (another resource, expired, revoked, a missing scope, a
PKCE mismatch, a redirect URI not registered, a code used twice or forged, CSRF on consent, a session
without a second factor) is refused and changes nothing. Static tokens keep working beside it.
"""

from datetime import timedelta

import httpx2
import pytest
from django.utils import timezone
from oauth2_provider.models import AccessToken, Application, RefreshToken

from idemops_demo.models import Order
from tests.support.issued_ids import call_labelled_sync
from tests.support.mcp_client import call_sync, error_of, post_raw
from tests.support.oauth_flow import (
    REDIRECT,
    code_of,
    connected,
    consent,
    console,
    exchange,
    open_consent,
    refresh,
    register,
    revoke,
)
from tests.support.operators import make_operator
from tools_app.access.roles import APPROVER, OPERATOR
from tools_app.conf import override_conf
from tools_app.models import AgentConnection, ApprovalRequest, AuditEvent, Task, Tenant

ORDER = {"customer": "ACME", "currency": "EUR", "items": [{"sku": "A-1", "quantity": 2, "unit_price": "9.50"}]}
NOTE = {"title": "Maintenance", "body": "Down at 2am", "audience": "staff"}


@pytest.fixture
def acme(token):
    """The live server's tenant (the `token` fixture commits it, with a static token of its own)."""
    return Tenant.objects.get(slug="acme")


@pytest.fixture
def olga(acme):
    return make_operator("olga", OPERATOR, acme)


pytestmark = pytest.mark.live


def people_tokens():
    """Access tokens a person consented to (registration leaves the client one of its own, RFC 7592)."""
    return AccessToken.objects.filter(user__isnull=False)


# --- discovery ---------------------------------------------------------------------------------------------


def test_a_401_names_the_protected_resource_metadata_which_names_this_authorization_server(web_server):
    base = web_server.base_url

    unauthenticated = httpx2.post(f"{base}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                                  headers={"Accept": "application/json, text/event-stream"}, timeout=30)

    assert unauthenticated.status_code == 401
    named = unauthenticated.headers["www-authenticate"].split('resource_metadata="')[1].split('"')[0]
    assert named == f"{base}/.well-known/oauth-protected-resource/mcp"
    resource = httpx2.get(named, timeout=30).json()
    assert resource["resource"] == f"{base}/mcp" and resource["authorization_servers"] == [base]
    assert set(resource["scopes_supported"]) == {"read", "write", "long"}
    assert httpx2.get(f"{base}/.well-known/oauth-protected-resource", timeout=30).status_code == 200
    server = httpx2.get(f"{base}/.well-known/oauth-authorization-server", timeout=30).json()
    assert server["issuer"] == base
    assert server["authorization_endpoint"] == f"{base}/oauth/authorize/"
    assert server["token_endpoint"] == f"{base}/oauth/token/"
    assert server["revocation_endpoint"] == f"{base}/oauth/revoke/"
    assert server["registration_endpoint"] == f"{base}/oauth/register/"
    assert server["code_challenge_methods_supported"] == ["S256"]
    assert set(server["grant_types_supported"]) == {"authorization_code", "refresh_token"}
    assert server["response_types_supported"] == ["code"]


# --- the flow ----------------------------------------------------------------------------------------------


def test_a_host_connects_by_oauth_and_its_token_calls_a_write_tool_as_its_person(web_server, acme, olga):
    base = web_server.base_url

    client_id, tokens = connected(base, olga, acme.pk)
    created = call_sync(web_server.mcp_url, tokens["access_token"], "create_order",
                        {**ORDER, "idempotency_key": "oauth-order-1"})

    assert not created.is_error, created.structured_content
    assert Order.objects.count() == 1
    connection = AgentConnection.objects.get(user=olga)
    assert (connection.tenant, connection.scopes, connection.application.client_id) == (acme, "read write", client_id)
    me = call_sync(web_server.mcp_url, tokens["access_token"], "whoami", {}).structured_content
    assert me["agent"] == f"agent:acme/oauth:{connection.pk}"
    assert people_tokens().get(application__client_id=client_id).user == olga
    assert AuditEvent.objects.filter(action="oauth.consented", actor="user:olga").count() == 1
    issued = AuditEvent.objects.get(action="oauth.token_issued")
    assert issued.tenant_id == acme.pk and issued.after["scopes"] == "read write"
    assert issued.after["resource"] == [f"{base}/mcp"]


def test_the_token_is_its_persons_so_they_cannot_approve_what_their_agent_asks(web_server, acme, olga, client):
    olivia = make_operator("olivia", APPROVER, acme)
    _, tokens = connected(web_server.base_url, olivia, acme.pk)

    asked = error_of(call_labelled_sync(web_server.mcp_url, tokens["access_token"], "publish_announcement",
                                        {**NOTE, "idempotency_key": "oauth-ann-1"}))
    request = ApprovalRequest.objects.get(pk=asked["approval"]["request_id"])

    assert request.requester_owner == olivia
    olivia.refresh_from_db()  # the live server's login re-hashed her password
    client.force_login(olivia)
    answer = client.post(f"/admin/tools_app/approvalqueue/{request.pk}/act/approve/", {"reason": "mine"},
                         follow=True)
    assert ApprovalRequest.objects.get(pk=request.pk).status == "pending", answer.content[:2000]
    assert "four eyes" in AuditEvent.objects.get(action="approval.refused", actor="user:olivia").reason


def test_a_refresh_rotates_the_refresh_token_and_the_old_one_is_refused(web_server, acme, olga):
    base = web_server.base_url
    client_id, tokens = connected(base, olga, acme.pk)

    renewed = refresh(base, client_id, tokens["refresh_token"])
    assert renewed.status_code == 200, renewed.text
    assert renewed.json()["refresh_token"] != tokens["refresh_token"]
    assert not call_sync(web_server.mcp_url, renewed.json()["access_token"], "whoami", {}).is_error
    assert AuditEvent.objects.filter(action="oauth.token_refreshed").count() == 1

    # the old refresh token again: refused, and (a reuse means it leaked) the tokens it led to are revoked
    again = refresh(base, client_id, tokens["refresh_token"])
    assert again.status_code == 400 and again.json()["error"] == "invalid_grant"
    assert post_raw(web_server.mcp_url, renewed.json()["access_token"], {
        "jsonrpc": "2.0", "id": 1, "method": "tools/list"}).status_code == 401


def test_a_revoked_token_is_refused_at_mcp_and_the_revocation_is_audited(web_server, acme, olga):
    base = web_server.base_url
    client_id, tokens = connected(base, olga, acme.pk)

    assert revoke(base, client_id, tokens["access_token"]).status_code == 200

    refused = post_raw(web_server.mcp_url, tokens["access_token"], {"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    assert refused.status_code == 401
    assert AuditEvent.objects.filter(action="oauth.token_revoked").count() == 1


def test_revoking_the_connection_in_the_console_ends_its_tokens(web_server, acme, olga):
    base = web_server.base_url
    client_id, tokens = connected(base, olga, acme.pk)
    http = console(base, olga)
    connection = AgentConnection.objects.get(user=olga)

    listed = http.get("/admin/tools_app/agentconnection/")
    done = http.post("/admin/tools_app/agentconnection/", data={
        "action": "revoke", "_selected_action": str(connection.pk), "index": "0",
        "csrfmiddlewaretoken": http.cookies["csrftoken"]})

    assert "test host" in listed.text and done.status_code == 302
    assert AgentConnection.objects.get(pk=connection.pk).revoked_at is not None
    assert post_raw(web_server.mcp_url, tokens["access_token"], {"jsonrpc": "2.0", "id": 1,
                                                                  "method": "tools/list"}).status_code == 401
    assert refresh(base, client_id, tokens["refresh_token"]).status_code == 400
    assert AuditEvent.objects.get(action="oauth.revoked").actor == "user:olga"


# --- refused, and nothing changes ------------------------------------------------------------------------------


def test_a_token_issued_for_another_resource_is_refused(web_server, acme, olga):
    base = web_server.base_url
    client_id = register(base)
    http = console(base, olga)
    opened = open_consent(http, base, client_id, resource="https://elsewhere.example/mcp")
    tokens = exchange(base, opened, code_of(consent(http, opened, tenant_id=acme.pk, granted=["read", "write"])),
                      resource="https://elsewhere.example/mcp")
    assert tokens.status_code == 200, tokens.text

    refused = post_raw(web_server.mcp_url, tokens.json()["access_token"], {
        "jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "create_order", "arguments": {**ORDER, "idempotency_key": "elsewhere"}}})

    assert refused.status_code == 401 and "invalid_token" in refused.headers["www-authenticate"]
    assert Order.objects.count() == 0


def test_an_expired_token_is_refused(web_server, acme, olga):
    _, tokens = connected(web_server.base_url, olga, acme.pk)
    AccessToken.objects.update(expires=timezone.now() - timedelta(seconds=1))

    refused = post_raw(web_server.mcp_url, tokens["access_token"], {"jsonrpc": "2.0", "id": 1, "method": "tools/list"})

    assert refused.status_code == 401


def test_a_write_without_the_write_scope_is_answered_403_insufficient_scope(web_server, acme, olga):
    base = web_server.base_url
    _, tokens = connected(base, olga, acme.pk, scope="read write", granted=["read"])

    refused = post_raw(web_server.mcp_url, tokens["access_token"], {
        "jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "create_order", "arguments": {**ORDER, "idempotency_key": "no-write"}}})
    long = post_raw(web_server.mcp_url, tokens["access_token"], {
        "jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "start_task", "arguments": {"tool": "ingest_document", "arguments": {"text": "x"},
                                                       "idempotency_key": "no-long"}}})

    assert refused.status_code == 403
    challenge = refused.headers["www-authenticate"]
    assert 'error="insufficient_scope"' in challenge and 'scope="write"' in challenge
    assert f'resource_metadata="{base}/.well-known/oauth-protected-resource/mcp"' in challenge
    assert long.status_code == 403 and 'scope="long"' in long.headers["www-authenticate"]
    assert Order.objects.count() == 0
    assert not call_sync(web_server.mcp_url, tokens["access_token"], "whoami", {}).is_error  # read still works


def test_the_tasks_methods_need_the_long_scope_and_a_token_without_it_cancels_nothing(web_server, acme, olga):
    base = web_server.base_url
    _, full = connected(base, olga, acme.pk, scope="read write long")
    _, short = connected(base, olga, acme.pk, scope="read write")
    started = post_raw(web_server.mcp_url, full["access_token"], {
        "jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "start_task", "arguments": {"tool": "ingest_document", "arguments": {"text": "x"},
                                                       "idempotency_key": "scoped-task"}}})
    assert started.status_code == 200, started.text
    task = Task.objects.get(tenant=acme)
    status_before = task.status


    def send(token: str, method: str) -> httpx2.Response:  # at a version whose tasks methods the server serves
        return httpx2.post(web_server.mcp_url, timeout=30, json={
            "jsonrpc": "2.0", "id": 2, "method": method, "params": {"taskId": str(task.pk)}}, headers={
            "Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": "2025-11-25"})

    answers = {method: send(short["access_token"], method) for method in ("tasks/get", "tasks/cancel")}
    followed = send(full["access_token"], "tasks/get")

    for method, answer in answers.items():
        assert answer.status_code == 403, (method, answer.text)
        assert 'error="insufficient_scope"' in answer.headers["www-authenticate"]
        assert 'scope="long"' in answer.headers["www-authenticate"]
    assert Task.objects.get(pk=task.pk).status == status_before
    assert not AuditEvent.objects.filter(action__startswith="task.cancel").exists()
    assert followed.status_code == 200 and str(task.pk) in followed.text  # the long scope reaches the method


def test_a_pkce_mismatch_and_the_plain_method_are_refused(web_server, acme, olga):
    base = web_server.base_url
    client_id = register(base)
    http = console(base, olga)
    opened = open_consent(http, base, client_id)
    code = code_of(consent(http, opened, tenant_id=acme.pk, granted=["read"]))

    mismatch = exchange(base, opened, code, verifier="not-the-verifier-" + "x" * 40)
    plain = open_consent(http, base, client_id, method="plain", challenge="a" * 50)

    assert mismatch.status_code == 400 and mismatch.json()["error"] == "invalid_grant"
    assert plain.page.status_code == 400 and "S256" in plain.page.text and "location" not in plain.page.headers
    assert not people_tokens().exists()


def test_an_unregistered_redirect_uri_is_refused_without_redirecting(web_server, acme, olga):
    base = web_server.base_url
    client_id = register(base)
    http = console(base, olga)

    opened = open_consent(http, base, client_id, redirect="http://evil.example/steal")

    assert opened.page.status_code == 400 and "location" not in opened.page.headers
    assert not AgentConnection.objects.exists()


def test_a_code_used_twice_or_forged_is_refused(web_server, acme, olga):
    base = web_server.base_url
    client_id = register(base)
    http = console(base, olga)
    opened = open_consent(http, base, client_id)
    code = code_of(consent(http, opened, tenant_id=acme.pk, granted=["read"]))

    first = exchange(base, opened, code)
    replayed = exchange(base, opened, code)
    forged = exchange(base, opened, "forged-" + code[7:])

    assert first.status_code == 200
    assert replayed.status_code == 400 and replayed.json()["error"] == "invalid_grant"
    assert forged.status_code == 400 and forged.json()["error"] == "invalid_grant"
    assert people_tokens().count() == 1


def test_consent_needs_a_second_factor_and_a_csrf_token(web_server, acme, olga):
    base = web_server.base_url
    client_id = register(base)
    unverified = console(base, olga, second_factor=False)

    sent_away = open_consent(unverified, base, client_id)
    crafted = unverified.post("/oauth/authorize/", data={
        "client_id": client_id, "redirect_uri": REDIRECT, "response_type": "code", "scope": "read",
        "code_challenge": "x" * 43, "code_challenge_method": "S256", "tenant": str(acme.pk), "granted": "read",
        "allow": "Connect", "csrfmiddlewaretoken": unverified.cookies["csrftoken"]})
    verified = console(base, olga)
    opened = open_consent(verified, base, client_id)
    forged = consent(verified, opened, tenant_id=acme.pk, granted=["read"], csrf=False)

    assert sent_away.page.status_code == 302 and "/admin/second-factor/" in sent_away.page.headers["location"]
    assert crafted.status_code == 403 and forged.status_code == 403
    refusal = AuditEvent.objects.get(action="oauth.consent_refused")
    assert refusal.actor == "user:olga" and "second factor required" in refusal.reason
    assert not AgentConnection.objects.exists() and not people_tokens().exists()


def test_static_bearer_tokens_keep_working_beside_oauth(web_server, token, acme, olga):
    connected(web_server.base_url, olga, acme.pk)

    created = call_sync(web_server.mcp_url, token, "create_order", {**ORDER, "idempotency_key": "static-1"})

    assert not created.is_error and Order.objects.count() == 1


# --- dynamic registration (in process) ---------------------------------------------------------------------


@pytest.mark.django_db
def test_dynamic_registration_is_rate_limited_per_address(settings, client):
    override_conf(settings, oauth_registrations_per_hour=2)
    body = {"client_name": "flood", "redirect_uris": [REDIRECT], "grant_types": ["authorization_code"],
            "response_types": ["code"], "token_endpoint_auth_method": "none"}

    answers = [client.post("/oauth/register/", body, content_type="application/json",
                           REMOTE_ADDR="203.0.113.7").status_code for _ in range(3)]
    elsewhere = client.post("/oauth/register/", body, content_type="application/json", REMOTE_ADDR="198.51.100.1")

    assert answers == [201, 201, 401] and elsewhere.status_code == 201
    assert Application.objects.count() == 3


@pytest.mark.django_db
def test_dynamic_registration_can_be_turned_off(settings, client):
    settings.OAUTH2_PROVIDER = {**settings.OAUTH2_PROVIDER, "DCR_ENABLED": False}

    refused = client.post("/oauth/register/", {"client_name": "x", "redirect_uris": [REDIRECT]},
                          content_type="application/json")
    metadata = client.get("/.well-known/oauth-authorization-server").json()

    assert refused.status_code == 404 and "registration_endpoint" not in metadata
    assert not Application.objects.exists() and not RefreshToken.objects.exists()


def test_consenting_again_to_another_tenant_ends_the_clients_earlier_tokens(web_server, acme, other_tenant_live):
    base = web_server.base_url
    olga = make_operator("olga", OPERATOR, acme, other_tenant_live)
    client_id = register(base)
    http = console(base, olga)
    first = open_consent(http, base, client_id)
    earlier = exchange(base, first, code_of(consent(http, first, tenant_id=acme.pk, granted=["read"]))).json()

    second = open_consent(http, base, client_id)
    later = exchange(base, second, code_of(consent(http, second, tenant_id=other_tenant_live.pk,
                                                   granted=["read"]))).json()

    assert post_raw(web_server.mcp_url, earlier["access_token"], {
        "jsonrpc": "2.0", "id": 1, "method": "tools/list"}).status_code == 401
    me = call_sync(web_server.mcp_url, later["access_token"], "whoami", {}).structured_content
    assert me["tenant_id"] == other_tenant_live.pk
    assert AgentConnection.objects.get(user=olga).tenant == other_tenant_live


@pytest.fixture
def other_tenant_live(acme):
    from tools_app import access

    return access.create_tenant("globex", "Globex")
