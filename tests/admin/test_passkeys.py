"""Passkeys (WebAuthn, django-otp-webauthn) as a second factor, beside the authenticator (docs/auth.md).

The browser tests give headless Chromium a virtual authenticator (the DevTools protocol's WebAuthn domain:
CTAP2, internal, resident keys, user verification) and drive the console at http://localhost:<port>:
WebAuthn takes a host name, not an address, so the loopback public URL's relying party is `localhost`
(idemops/settings.py). The server verifies real signatures; the database says what happened.
"""

import json
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from decimal import Decimal
from urllib.parse import urlsplit

import pytest
from django.urls import reverse
from django.utils import timezone
from django_otp import DEVICE_ID_SESSION_KEY
from django_otp.plugins.otp_totp.models import TOTPDevice
from django_otp_webauthn.models import WebAuthnCredential

from tests.admin.test_console_browser import announce, person
from tests.support.browser import browser_page, log_in, needs_chromium, shot
from tests.support.issued_ids import call_labelled_sync
from tests.support.mcp_client import error_of
from tests.support.operators import make_operator
from tools_app.access import second_factor
from tools_app.access.roles import APPROVER
from tools_app.approvals.models import ApprovalSettings
from tools_app.conf import conf
from tools_app.models import ApprovalRequest, ApprovalStatus, AuditEvent, Tenant

# --- who may register (no browser) -----------------------------------------------------------------------


def begin_registration(client):
    return client.post(reverse("otp_webauthn:credential-registration-begin"), content_type="application/json")


@pytest.mark.django_db
def test_a_password_only_session_of_a_person_with_an_authenticator_may_not_register_a_passkey(client, tenant):
    bob = make_operator("bob", APPROVER, tenant)
    client.force_login(bob, second_factor=False)

    response = begin_registration(client)

    assert response.status_code == 403 and response.json()["code"] == "user_not_verified"
    assert "otp_webauthn_register_state" not in client.session


@pytest.mark.django_db
def test_a_verified_session_gets_registration_options_for_the_public_urls_host(client, tenant, settings):
    bob = make_operator("bob", APPROVER, tenant)
    client.force_login(bob)

    response = begin_registration(client)

    assert response.status_code == 200
    options = response.json()
    assert options["rp"] == {"name": "idemops", "id": settings.OTP_WEBAUTHN_RP_ID}
    assert options["user"]["name"] == "bob"
    public = urlsplit(conf().public_url)  # a loopback address here: passkeys at localhost, on its port
    assert (public.hostname, settings.OTP_WEBAUTHN_RP_ID) == ("127.0.0.1", "localhost")
    assert settings.OTP_WEBAUTHN_ALLOWED_ORIGINS == [f"http://localhost:{public.port}"]


@pytest.mark.django_db
def test_a_passkey_only_person_without_a_verified_session_is_not_offered_a_new_authenticator(client, tenant):
    # given: a person whose one device is a passkey, signed in with the password only
    bob = make_operator("bob", APPROVER, tenant)
    TOTPDevice.objects.filter(user=bob).delete()
    WebAuthnCredential.objects.create(user=bob, name="passkey", credential_id=b"bob's key", public_key=b"cose",
                                      aaguid="00000000-0000-0000-0000-000000000000")
    client.force_login(bob, second_factor=False)

    # when: the password alone opens the second-factor page
    page = client.get(reverse("admin:second_factor"))

    # then: it asks for the passkey (or a recovery code); no authenticator secret, no new device
    assert page.status_code == 200 and page.context["enrolling"] is False
    assert b"totp-secret" not in page.content and b"passkey-verification-button" in page.content
    assert not TOTPDevice.objects.filter(user=bob).exists()


@pytest.mark.django_db
def test_a_passkey_only_person_asked_for_a_fresh_second_factor_is_offered_the_passkey(client, tenant):
    # given: a person whose one device is a passkey, in a session it verified an hour ago
    bob = make_operator("bob", APPROVER, tenant)
    TOTPDevice.objects.filter(user=bob).delete()
    passkey = WebAuthnCredential.objects.create(user=bob, name="passkey", credential_id=b"bob's key",
                                                public_key=b"cose", aaguid="00000000-0000-0000-0000-000000000000")
    client.force_login(bob, second_factor=False)
    session = client.session
    session[DEVICE_ID_SESSION_KEY] = passkey.persistent_id
    session[second_factor.VERIFIED_AT_SESSION_KEY] = (timezone.now() - timedelta(hours=1)).isoformat()
    session.save()

    # when: a step-up sends the person to the second-factor page
    page = client.get(reverse("admin:second_factor") + "?stale=1")

    # then: the passkey is offered (beside adding an authenticator, which a verified session may)
    assert page.context["verified_at"] is not None
    assert b"passkey-verification-button" in page.content


# --- in a real browser with a virtual authenticator ------------------------------------------------------


def localhost(web_server) -> str:
    return web_server.base_url.replace("127.0.0.1", "localhost")


def virtual_authenticator(page) -> tuple:
    cdp = page.context.new_cdp_session(page)
    cdp.send("WebAuthn.enable")
    added = cdp.send("WebAuthn.addVirtualAuthenticator", {"options": {
        "protocol": "ctap2", "transport": "internal", "hasResidentKey": True, "hasUserVerification": True,
        "isUserVerified": True}})
    return cdp, added["authenticatorId"]


def register_passkey(page, base_url: str, username: str) -> None:
    """`username` logs in with the authenticator's code and registers a passkey on the second-factor page."""
    log_in(page, base_url, username, "/admin/second-factor/")
    page.click("#passkey-register-button")
    page.wait_for_selector("#passkey-register-status-message[data-status-enum=success]")


def crafted_post(page, path: str, fields: dict) -> int:
    """A form POST from the page (its cookies and CSRF token), as a person skipping the console's forms would."""
    return page.evaluate("""async ([path, fields]) => {
        const csrf = document.cookie.split("; ").find((c) => c.startsWith("csrftoken=")).split("=")[1];
        const body = new URLSearchParams({...fields, csrfmiddlewaretoken: csrf});
        return (await fetch(path, {method: "POST", body, redirect: "manual"})).status;
    }""", [path, fields])


def act_path(request_id: int) -> str:
    return f"/admin/tools_app/approvalqueue/{request_id}/act/approve/"


def in_a_browser(test):
    for mark in needs_chromium:
        test = mark(test)
    return test


@in_a_browser
def test_a_person_registers_a_passkey_logs_in_with_password_and_passkey_and_approves(web_server, token):
    # given: one pending approval; an approver with an authenticator
    approval, _args = announce(web_server, token)
    person("alice", APPROVER)
    base = localhost(web_server)

    with browser_page() as page:
        virtual_authenticator(page)
        # when: she registers a passkey (from a session verified by her code), and logs out
        register_passkey(page, base, "alice")
        page.context.clear_cookies()
        # and logs in with her password only, on her way to the request: the login's second step asks for her
        # passkey, then she approves
        log_in(page, base, "alice", f"/admin/tools_app/approvalqueue/{approval['request_id']}/change/",
               second_factor=False)
        page.wait_for_selector("#passkey-verification-button")
        second_step = page.url
        shot(page, "second-factor-passkey")
        page.click("#passkey-verification-button")
        page.click("#action-approve")
        page.wait_for_selector("#id_reason")
        page.fill("#id_reason", "checked with the team")
        page.keyboard.press("Control+Enter")
        page.wait_for_selector("ul.messagelist")
        message = page.locator("ul.messagelist").inner_text()

    # then: her passkey is a device of hers; its registration and its use are audited; the request is approved
    assert second_step.startswith(f"{base}/admin/second-factor/?next=")
    assert WebAuthnCredential.objects.filter(user__username="alice").count() == 1
    enrolled = AuditEvent.objects.filter(action="second_factor.enrolled", actor="user:alice", after__device="passkey")
    used = AuditEvent.objects.filter(action="second_factor.verified", actor="user:alice", after__device="passkey")
    assert (enrolled.count(), used.count()) == (1, 1)
    assert "approved; it is being executed" in message
    assert ApprovalRequest.objects.filter(pk=approval["request_id"], status=ApprovalStatus.APPROVED,
                                          decided_by="user:alice").count() == 1
    assert not AuditEvent.objects.filter(action="second_factor.passkey_refused").exists()


@in_a_browser
def test_a_passkey_button_pressed_before_the_pages_translations_arrive_still_verifies(web_server, token):
    # given: an approver with a passkey; the page's translations catalogue (where the passkey script's
    # `gettext` comes from) arrives seconds after the button is shown, as from a busy server
    person("alice", APPROVER)
    base = localhost(web_server)

    with browser_page() as page:
        virtual_authenticator(page)
        register_passkey(page, base, "alice")
        page.context.clear_cookies()

        def late(route):
            page.wait_for_timeout(3000)
            route.continue_()

        page.route("**/second-factor/passkey/jsi18n/*", late)
        page.route("**/second-factor/passkey/jsi18n/", late)
        # when: she logs in with her password and presses the passkey button as soon as it shows
        log_in(page, base, "alice", "/admin/", second_factor=False)
        page.click("#passkey-verification-button")
        page.wait_for_url(f"{base}/admin/")

    # then: the passkey verified the session
    assert AuditEvent.objects.filter(action="second_factor.verified", actor="user:alice",
                                     after__device="passkey").count() == 1


# The assertion of another user's credential: the page asks for the options as its own person would, then lets
# the authenticator offer any passkey it holds (an empty allow-list), and sends what it signed.
ASSERT_ANY_PASSKEY = """async () => {
    const csrf = document.cookie.split("; ").find((c) => c.startsWith("csrftoken=")).split("=")[1];
    const post = (url, body) => fetch(url, {method: "POST", headers: {"X-CSRFToken": csrf,
        "Content-Type": "application/json"}, body: body && JSON.stringify(body)});
    const bytes = (text) => Uint8Array.from(atob(text.replace(/-/g, "+").replace(/_/g, "/")), (c) => c.charCodeAt(0));
    const text = (buffer) => btoa(String.fromCharCode(...new Uint8Array(buffer)))
        .replace(/\\+/g, "-").replace(/\\//g, "_").replace(/=+$/, "");
    const options = await (await post("/admin/second-factor/passkey/authentication/begin/")).json();
    const credential = await navigator.credentials.get({publicKey: {
        challenge: bytes(options.challenge), rpId: options.rpId, allowCredentials: [], userVerification: "preferred"}});
    const answer = await post("/admin/second-factor/passkey/authentication/complete/", {
        id: credential.id, rawId: text(credential.rawId), type: credential.type, clientExtensionResults: {},
        response: {authenticatorData: text(credential.response.authenticatorData),
                   clientDataJSON: text(credential.response.clientDataJSON),
                   signature: text(credential.response.signature),
                   userHandle: credential.response.userHandle && text(credential.response.userHandle)}});
    return [answer.status, await answer.text()];
}"""


@in_a_browser
def test_a_failed_passkey_assertion_leaves_the_session_unverified_and_a_crafted_approve_is_refused(
        web_server, token):
    # given: one pending approval; alice registered a passkey on this browser's authenticator; bob has none
    approval, _args = announce(web_server, token)
    person("alice", APPROVER)
    person("bob", APPROVER)
    base = localhost(web_server)

    def refusals(username):
        return AuditEvent.objects.filter(action="second_factor.passkey_refused", actor=f"user:{username}").count()

    with browser_page() as page:
        cdp, authenticator = virtual_authenticator(page)
        register_passkey(page, base, "alice")

        # when: bob, with his password only, presents alice's passkey as his second factor
        page.context.clear_cookies()
        log_in(page, base, "bob", "/admin/second-factor/", second_factor=False)
        page.wait_for_selector("input[name=code]")
        status, body = page.evaluate(ASSERT_ANY_PASSKEY)
        bob_approves = crafted_post(page, act_path(approval["request_id"]), {"reason": "crafted"})

        # and: alice, with her password only, uses her passkey through an authenticator whose signature is bogus
        page.context.clear_cookies()
        cdp.send("WebAuthn.setResponseOverrideBits", {"authenticatorId": authenticator, "isBogusSignature": True})
        log_in(page, base, "alice", "/admin/second-factor/", second_factor=False)
        page.click("#passkey-verification-button")
        page.wait_for_selector("#passkey-verification-status-message[data-status-enum=server-error]")
        shown = page.locator("#passkey-verification-status-message").inner_text()
        alice_approves = crafted_post(page, act_path(approval["request_id"]), {"reason": "crafted"})

    # then: the server refused both assertions (audited); neither session was verified; nothing was approved
    assert (status, json.loads(body)["code"]) == (403, "credential_user_mismatch")
    assert "Invalid authentication response" in shown
    assert (refusals("bob"), refusals("alice")) == (1, 1)
    assert (bob_approves, alice_approves) == (403, 403)
    request = ApprovalRequest.objects.get(pk=approval["request_id"])
    assert (request.status, request.approvals) == (ApprovalStatus.PENDING, 0)
    refused = AuditEvent.objects.filter(action="approval.refused", object_id=str(request.pk))
    assert sorted(refused.values_list("actor", flat=True)) == ["user:alice", "user:bob"]
    assert not AuditEvent.objects.filter(action="second_factor.verified").exists()


@in_a_browser
def test_a_person_with_no_device_yet_registers_a_passkey_first_and_gets_recovery_codes(web_server, token):
    # given: a new approver with no second factor at all
    alice = person("alice", APPROVER)
    TOTPDevice.objects.filter(user=alice).delete()
    base = localhost(web_server)

    with browser_page() as page:
        virtual_authenticator(page)
        # when: she logs in with her password and registers a passkey on the second-factor page
        log_in(page, base, "alice", "/admin/second-factor/", second_factor=False)
        page.click("#passkey-register-button")
        page.wait_for_selector("#recovery-codes:not(:empty)")
        codes = page.locator("#recovery-codes").inner_text().split()

    # then: the passkey is hers, ten recovery codes were issued and shown once, both audited
    assert WebAuthnCredential.objects.filter(user=alice).count() == 1
    assert len(codes) == 10
    assert AuditEvent.objects.filter(action="second_factor.enrolled", actor="user:alice",
                                     after__device="passkey").count() == 1
    assert AuditEvent.objects.filter(action="second_factor.recovery_codes_issued", actor="user:alice").count() == 1


STEP_UP_SECONDS = 9  # short, so that a verification goes stale while the test waits


@pytest.fixture
def step_up_server(gateway, sink, transactional_db):
    from tests.support.processes import WebServer, downstream_env

    server = WebServer("web-step-up", **downstream_env(gateway, sink,
                                                       IDEMOPS_STEP_UP_MINUTES=str(STEP_UP_SECONDS / 60)))
    yield server
    server.stop()


def pending_payment(web_server, token, amount: str) -> int:
    ApprovalSettings.objects.get_or_create(tenant=Tenant.objects.get(slug="acme"), defaults={
        "payment_threshold": Decimal("100"), "step_up_amount": Decimal("1000"), "threshold_currency": "EUR"})
    args = {"amount": amount, "currency": "EUR", "payee": "ACME", "idempotency_key": "pay-big"}
    with ThreadPoolExecutor(1) as pool:  # the MCP client's event loop, in a thread of its own
        answer = pool.submit(call_labelled_sync, web_server.mcp_url, token, "request_payment", args).result()
    return error_of(answer)["approval"]["request_id"]


@in_a_browser
def test_a_passkey_used_again_satisfies_the_step_up_a_large_approval_asks_for(step_up_server, token):
    # given: a payment above acme's step-up amount; an approver with a passkey
    request_id = pending_payment(step_up_server, token, "5000.00")
    person("alice", APPROVER)
    base = localhost(step_up_server)

    with browser_page() as page:
        virtual_authenticator(page)
        register_passkey(page, base, "alice")
        page.context.clear_cookies()
        # when: she logs in with her password and her passkey, opens the payment and approves
        log_in(page, base, "alice", f"/admin/tools_app/approvalqueue/{request_id}/change/", second_factor=False)
        page.click("#passkey-verification-button")
        page.click("#action-approve")
        page.wait_for_selector("#id_reason")
        # and: her passkey's verification goes stale before she confirms
        page.wait_for_timeout((STEP_UP_SECONDS + 1) * 1000)
        page.fill("#id_reason", "checked the invoice")
        page.keyboard.press("Control+Enter")
        page.wait_for_selector("#passkey-verification-button")
        asked_again = page.url
        # then: she uses the passkey again, and confirms at once
        page.click("#passkey-verification-button")
        page.wait_for_selector("#id_reason")
        page.fill("#id_reason", "checked the invoice")
        page.keyboard.press("Control+Enter")
        page.wait_for_selector("ul.messagelist")

    # then: the stale verification was refused as a step-up and asked again; the fresh passkey approved it
    assert "stale=1" in asked_again
    refusals = AuditEvent.objects.filter(action="approval.refused", object_id=str(request_id)).order_by("pk")
    assert [(e.actor, e.reason.split(":")[0]) for e in refusals] == [("user:alice", "step-up")]
    assert AuditEvent.objects.filter(action="second_factor.verified", actor="user:alice",
                                     after__device="passkey").count() == 2
    assert ApprovalRequest.objects.filter(pk=request_id, status=ApprovalStatus.APPROVED,
                                          decided_by="user:alice").count() == 1
