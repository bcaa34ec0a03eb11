import hashlib
import io

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command

from idemops.conf import override_conf
from tools_app import access
from tools_app.management.demo import ensure_demo
from tools_app.models import ApiToken, AuditEvent, Tenant


@pytest.mark.django_db
def test_create_tenant_prints_a_token_once_and_stores_only_its_digest():
    out = io.StringIO()

    call_command("create_tenant", "acme", "--token-name", "billing-bot", stdout=out)

    raw = out.getvalue().strip().splitlines()[-1]
    token = ApiToken.objects.get()
    assert raw.startswith("idm_") and token.name == "billing-bot"
    assert token.digest == hashlib.sha256(raw.encode()).hexdigest()
    assert raw not in str(list(ApiToken.objects.values()))
    assert access.authenticate_token(raw) == token
    assert AuditEvent.objects.filter(action="token.issued", object_id=str(token.pk)).exists()


@pytest.mark.django_db
def test_issue_token_refuses_an_unknown_tenant():
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="no tenant"):
        call_command("issue_token", "nobody", "bot")


@pytest.mark.django_db
def test_the_demo_is_created_once_and_its_token_works(settings, tmp_path):
    override_conf(settings, var_dir=tmp_path)

    first, second = ensure_demo(), ensure_demo()

    assert first == second
    assert Tenant.objects.filter(slug="demo").count() == 1
    assert User.objects.filter(username="admin", is_superuser=True).count() == 1
    assert access.authenticate_token(second["token"]).tenant.slug == "demo"
    assert (tmp_path / "demo-credentials.json").stat().st_mode & 0o077 == 0


@pytest.mark.django_db
def test_a_revoked_token_no_longer_authenticates():
    tenant = access.create_tenant("acme")
    token, raw = access.issue_token(tenant, "bot")

    assert access.revoke_token(token, actor="user:ops", reason="leaked")
    assert access.authenticate_token(raw) is None
    assert not access.revoke_token(token, actor="user:ops")  # already revoked: nothing happens twice
