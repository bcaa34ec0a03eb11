"""Operators for tests: real users in the real groups (tools_app.roles), with tenant access."""

import re

import httpx2
from django.contrib.auth import get_user_model

from tools_app.access import roles

PASSWORD = "correct-horse-battery"


def make_operator(username: str, role: str, *tenants):
    user = get_user_model().objects.create_user(username, password=PASSWORD)
    roles.grant(user, role, [t.slug for t in tenants], actor="system:test")
    return get_user_model().objects.get(pk=user.pk)  # fresh: no cached permissions


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
    answer = session.post("/admin/login/", data={"csrfmiddlewaretoken": csrf, "username": username,
                                                 "password": PASSWORD, "next": "/admin/"})
    assert answer.status_code == 302, answer.text[:500]
    return session
