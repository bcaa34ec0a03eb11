"""An MCP host's side of OAuth 2.1 against the live server, by hand over HTTP: register (RFC 7591), send
the person to the consent page (a console session with its second factor), take the code, exchange it
with the PKCE verifier, refresh, revoke. tests/access/test_oauth.py drives it; the SDK's own client
provider drives the same server in tests/access/test_oauth_sdk_clients.py.
"""

from __future__ import annotations

import base64
import hashlib
import re
import secrets
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import httpx2

from tests.support.operators import PASSWORD, current_code, login_for_the_web_server

REDIRECT = "http://127.0.0.1:9/callback"


def pkce() -> tuple[str, str]:
    verifier = secrets.token_urlsafe(48)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    return verifier, challenge


def register(base: str, *, redirect: str = REDIRECT, name: str = "test host") -> str:
    response = httpx2.post(f"{base}/oauth/register/", timeout=30, json={
        "client_name": name, "redirect_uris": [redirect], "grant_types": ["authorization_code", "refresh_token"],
        "response_types": ["code"], "token_endpoint_auth_method": "none"})
    assert response.status_code == 201, response.text
    return str(response.json()["client_id"])


def console(base: str, user, *, second_factor: bool = True) -> httpx2.Client:
    """A person logged in to the console over HTTP (with their authenticator's code unless told not to)."""
    login_for_the_web_server(user)
    http = httpx2.Client(base_url=base, timeout=30)
    http.get("/admin/login/")
    response = http.post("/admin/login/?next=/admin/", data={
        "username": user.get_username(), "password": PASSWORD,
        "otp_token": current_code(user) if second_factor else "",
        "csrfmiddlewaretoken": http.cookies["csrftoken"], "next": "/admin/"})
    assert response.status_code == 302, response.text[:500]
    return http


@dataclass
class Consent:
    client_id: str
    verifier: str
    page: httpx2.Response  # the consent page (or what came instead)
    redirect: str = REDIRECT

    def fields(self) -> dict[str, str]:
        return dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', self.page.text))


def open_consent(http: httpx2.Client, base: str, client_id: str, *, scope: str = "read write",
                 resource: str | None = None, redirect: str = REDIRECT, method: str = "S256",
                 challenge: str | None = None) -> Consent:
    verifier, made = pkce()
    params = {"response_type": "code", "client_id": client_id, "redirect_uri": redirect, "scope": scope,
              "state": "st-1", "code_challenge": challenge or made, "code_challenge_method": method,
              "resource": resource if resource is not None else f"{base}/mcp"}
    return Consent(client_id, verifier, http.get(f"/oauth/authorize/?{urlencode(params)}"), redirect)


def consent(http: httpx2.Client, opened: Consent, *, tenant_id: int, granted: list[str],
            csrf: bool = True) -> httpx2.Response:
    assert opened.page.status_code == 200, opened.page.text[:1000]
    data: dict[str, Any] = {**opened.fields(), "tenant": str(tenant_id), "granted": granted, "allow": "Connect"}
    if not csrf:
        data.pop("csrfmiddlewaretoken", None)
    return http.post("/oauth/authorize/", data=data)


def code_of(response: httpx2.Response) -> str:
    assert response.status_code == 302, response.text[:1000]
    query = parse_qs(urlsplit(response.headers["location"]).query)
    assert query.get("state") == ["st-1"], query
    return query["code"][0]


def exchange(base: str, opened: Consent, code: str, *, verifier: str | None = None,
             resource: str | None = None) -> httpx2.Response:
    return httpx2.post(f"{base}/oauth/token/", timeout=30, data={
        "grant_type": "authorization_code", "code": code, "redirect_uri": opened.redirect,
        "client_id": opened.client_id, "code_verifier": verifier or opened.verifier,
        "resource": resource or f"{base}/mcp"})


def refresh(base: str, client_id: str, refresh_token: str) -> httpx2.Response:
    return httpx2.post(f"{base}/oauth/token/", timeout=30, data={
        "grant_type": "refresh_token", "refresh_token": refresh_token, "client_id": client_id})


def revoke(base: str, client_id: str, token: str) -> httpx2.Response:
    return httpx2.post(f"{base}/oauth/revoke/", timeout=30, data={"token": token, "client_id": client_id})


def connected(base: str, user, tenant_id: int, *, scope: str = "read write",
              granted: list[str] | None = None) -> tuple[str, dict[str, Any]]:
    """The whole flow: (client_id, the token response)."""
    client_id = register(base)
    http = console(base, user)
    opened = open_consent(http, base, client_id, scope=scope)
    tokens = exchange(base, opened, code_of(consent(http, opened, tenant_id=tenant_id,
                                                    granted=granted or scope.split())))
    assert tokens.status_code == 200, tokens.text
    return client_id, tokens.json()
