"""Operators for tests: real users in the real groups (tools_app.roles), with tenant access, each with a
confirmed authenticator, as a person who entered its code would be (tools_app.access.second_factor)."""

import re
import time

import httpx2
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone
from django_otp import DEVICE_ID_SESSION_KEY
from django_otp.oath import TOTP

from tools_app.access import roles, second_factor

PASSWORD = "correct-horse-battery"


def make_operator(username: str, role: str, *tenants):
    user = get_user_model().objects.create_user(username, password=PASSWORD)
    roles.grant(user, role, [t.slug for t in tenants], actor="system:test")
    return verified(get_user_model().objects.get(pk=user.pk))  # fresh: no cached permissions


def authenticator(user):
    """The user's confirmed TOTP device, enrolled on first use."""
    return second_factor.totp_device(user) or second_factor.enrol(user, actor="system:test", confirmed=True)


def verified(user, *, at=None):
    """`user` as a request of a session that entered an authenticator code (at `at`, default now) carries it:
    what django-otp's middleware and SecondFactorTimeMiddleware set on request.user."""
    user.otp_device = authenticator(user)
    user.second_factor_at = at or timezone.now()
    return user


def verify_session(client, user, *, at=None) -> None:
    """Mark `client`'s signed-in session as having entered `user`'s authenticator code (at `at`)."""
    session = client.session
    session[DEVICE_ID_SESSION_KEY] = authenticator(user).persistent_id
    session[second_factor.VERIFIED_AT_SESSION_KEY] = (at or timezone.now()).isoformat()
    session.save()


class VerifiedClient(Client):
    """The test client whose force_login is a login with the authenticator code, unless told otherwise:
    `second_factor=False` is a session that entered the password only."""

    def force_login(self, user, backend=None, *, second_factor=True):
        super().force_login(user, backend)
        if second_factor:
            verify_session(self, user)


def current_code(user) -> str:
    """A code the user's authenticator shows now, one not used yet (TOTP codes are good once): waits for the
    next 30-second step if this one was used."""
    device = authenticator(user)
    device.refresh_from_db()
    totp = TOTP(device.bin_key, device.step, device.t0, device.digits, device.drift)
    while totp.t() <= device.last_t:
        time.sleep(0.5)
    return f"{totp.token():0{device.digits}d}"


def agent_owner(username: str = "owner"):
    """The person responsible for a test agent (every API token has an owner); no role of their own."""
    email = f"{username}@example.invalid"
    return get_user_model().objects.get_or_create(username=username, defaults={"email": email})[0]


def login_for_the_web_server(user) -> None:
    """Hash the password with Django's default hasher: the uvicorn child runs the production settings,
    which do not accept the test settings' fast MD5 hashes."""
    from django.contrib.auth.hashers import PBKDF2PasswordHasher

    hasher = PBKDF2PasswordHasher()
    user.password = hasher.encode(PASSWORD, hasher.salt(), iterations=1000)
    user.save(update_fields=["password"])


def admin_session(web, username: str) -> httpx2.Client:
    """A person logged in to `web`'s admin over real HTTP (session and CSRF cookies)."""
    session = httpx2.Client(base_url=web.base_url, timeout=30)
    page = session.get("/admin/login/")
    csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)
    answer = session.post("/admin/login/", data={
        "csrfmiddlewaretoken": csrf, "username": username, "password": PASSWORD, "next": "/admin/",
        "otp_token": current_code(get_user_model().objects.get(username=username))})
    assert answer.status_code == 302, answer.text[:500]
    return session
