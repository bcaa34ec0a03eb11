"""Operators for tests: real users in the real groups (tools_app.roles), with tenant access."""

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
