"""Real MCP hosts connect by OAuth: the Python SDK's OAuthClientProvider and the TypeScript SDK's client
auth (tests/interop/oauth_client.mjs) each discover the authorization server from /mcp's 401, register
themselves, and send their person to the consent page, which headless Chromium (Playwright) completes
as a person would (console login with the authenticator's code, the tenant, Connect); the client takes
the code from the redirect, exchanges it with its PKCE verifier and the resource, and calls a write
tool. Nothing here is ours but the server.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from urllib.parse import parse_qs, urlsplit

import httpx2
import pytest
from mcp import Client
from mcp.client.auth import OAuthClientProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import AuthorizationCodeResult, OAuthClientInformationFull, OAuthClientMetadata, OAuthToken

from idemops_demo.models import Order
from tests.support.browser import CHROMIUM, CHROMIUM_ARGS, browser_page, code_for, needs_chromium
from tests.support.interop_support import installed
from tests.support.operators import PASSWORD, current_code, login_for_the_web_server, make_operator
from tools_app.access.roles import OPERATOR
from tools_app.models import AgentConnection, AuditEvent, Tenant

pytestmark = needs_chromium

CALLBACK = "http://127.0.0.1:9/callback"  # never reached: the browser's request to it is intercepted
ORDER = {"customer": "ACME", "currency": "EUR", "items": [{"sku": "A-1", "quantity": 2, "unit_price": "9.50"}],
         "idempotency_key": "sdk-oauth-order-1"}


class Memory:
    """The SDK's TokenStorage, in memory."""

    def __init__(self) -> None:
        self.tokens: OAuthToken | None = None
        self.client: OAuthClientInformationFull | None = None

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client = client_info


class Person:
    """The person at the browser: logs in to the console with password and code, picks the tenant, connects."""

    def __init__(self, username: str, code: str, tenant: str) -> None:
        self.username, self.code, self.tenant = username, code, tenant
        self.redirected: asyncio.Future[str] | None = None

    async def open(self, authorization_url: str) -> None:
        from playwright.async_api import async_playwright

        self.redirected = asyncio.get_running_loop().create_future()
        async with async_playwright() as playwright:
            browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = await browser.new_page()
            page.set_default_timeout(30_000)

            async def callback(route) -> None:
                if not self.redirected.done():
                    self.redirected.set_result(route.request.url)
                await route.fulfill(status=200, body="You may close this window.")

            await page.route(f"{CALLBACK}*", callback)
            await page.goto(authorization_url)
            await page.fill("#id_username", self.username)
            await page.fill("#id_password", PASSWORD)
            await page.fill("#id_otp_token", self.code)
            await page.click("input[type=submit]")
            await page.wait_for_selector("#authorizationForm")
            await page.select_option("#id_tenant", label=self.tenant)
            await page.click("input[name=allow]")
            await asyncio.wait_for(asyncio.shield(self.redirected), 30)
            await browser.close()

    async def callback(self) -> AuthorizationCodeResult:
        assert self.redirected is not None, "the provider asks for the code after sending the person away"
        query = parse_qs(urlsplit(await self.redirected).query)
        return AuthorizationCodeResult(code=query["code"][0], state=query.get("state", [None])[0],
                                       iss=query.get("iss", [None])[0])


async def connect_and_create_an_order(mcp_url: str, person: Person) -> tuple[dict, Memory]:
    storage = Memory()
    provider = OAuthClientProvider(
        server_url=mcp_url,
        client_metadata=OAuthClientMetadata(client_name="python-sdk host", redirect_uris=[CALLBACK],
                                            grant_types=["authorization_code", "refresh_token"],
                                            response_types=["code"], token_endpoint_auth_method="none"),
        storage=storage, redirect_handler=person.open, callback_handler=person.callback)
    async with httpx2.AsyncClient(auth=provider, timeout=60) as http:
        async with Client(streamable_http_client(mcp_url, http_client=http), mode="legacy") as client:
            result = await client.call_tool("create_order", ORDER)
    assert not result.is_error, result.structured_content
    return result.structured_content, storage


def test_the_python_sdks_oauth_client_connects_through_the_browser_and_calls_a_write_tool(web_server, token):
    acme = Tenant.objects.get(slug="acme")
    olga = make_operator("olga", OPERATOR, acme)
    login_for_the_web_server(olga)
    person = Person("olga", current_code(olga), "acme")

    created, storage = asyncio.run(connect_and_create_an_order(web_server.mcp_url, person))

    assert Order.objects.filter(pk=created["order_id"]).exists()
    connection = AgentConnection.objects.get(user=olga)
    assert connection.tenant == acme and connection.application.name == "python-sdk host"
    assert set(connection.scopes.split()) >= {"read", "write"}
    assert storage.tokens is not None and storage.tokens.refresh_token
    issued = AuditEvent.objects.get(action="oauth.token_issued")
    assert issued.after["resource"] == [f"{web_server.base_url}/mcp"] and issued.tenant_id == acme.pk


def consent_in_the_browser(authorization_url: str, username: str, tenant: str) -> dict[str, list[str]]:
    """The person's side with Playwright's sync API: log in with password and code, pick the tenant, connect;
    the query of the redirect to the host's callback (intercepted, never sent)."""
    redirected: list[str] = []
    with browser_page() as page:
        def callback(route) -> None:
            redirected.append(route.request.url)
            route.fulfill(status=200, body="You may close this window.")

        page.route(f"{CALLBACK}*", callback)
        page.goto(authorization_url)
        page.fill("#id_username", username)
        page.fill("#id_password", PASSWORD)
        page.fill("#id_otp_token", code_for(username))
        page.click("input[type=submit]")
        page.wait_for_selector("#authorizationForm")
        page.select_option("#id_tenant", label=tenant)
        page.click("input[name=allow]")
        page.wait_for_url(f"{CALLBACK}*")
    return parse_qs(urlsplit(redirected[0]).query)


@pytest.mark.skipif(shutil.which("node") is None, reason="Node is not installed (the TypeScript SDK's client)")
def test_the_typescript_sdks_oauth_client_connects_through_the_browser_and_calls_a_write_tool(web_server, token):
    acme = Tenant.objects.get(slug="acme")
    olga = make_operator("olga", OPERATOR, acme)
    login_for_the_web_server(olga)
    interop = installed()
    node = subprocess.Popen(["node", "oauth_client.mjs", web_server.mcp_url, CALLBACK, "create_order",
                             json.dumps({**ORDER, "idempotency_key": "ts-oauth-order-1"})],
                            cwd=interop, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        asked = json.loads(node.stdout.readline() or "{}")
        assert "authorize" in asked, node.stderr.read()[-3000:]
        query = consent_in_the_browser(asked["authorize"], "olga", "acme")
        node.stdin.write(query["code"][0] + "\n")
        node.stdin.flush()
        answered = json.loads(node.stdout.readline() or "{}")
        assert node.wait(timeout=60) == 0, node.stderr.read()[-3000:]
    finally:
        node.kill()

    assert answered["isError"] is False, answered
    assert Order.objects.filter(pk=answered["result"]["order_id"]).exists()
    connection = AgentConnection.objects.get(user=olga)
    assert connection.tenant == acme and connection.application.name == "typescript-sdk host"


@pytest.fixture(autouse=True)
def _playwright_installed():
    pytest.importorskip("playwright.async_api", reason="Playwright is not installed")
