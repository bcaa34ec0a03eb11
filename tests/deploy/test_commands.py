import base64
import hashlib
import io

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django_otp.oath import TOTP
from django_otp.plugins.otp_totp.models import TOTPDevice

from tests.support.operators import agent_owner
from tools_app import access
from tools_app.conf import override_conf
from tools_app.management.commands.serve import banner
from tools_app.management.demo import DEMO_STEP_UP_AMOUNT, ensure_demo
from tools_app.models import ApiToken, ApprovalSettings, AuditEvent, Tenant


@pytest.mark.django_db
def test_create_tenant_prints_a_token_once_and_stores_only_its_digest():
    out = io.StringIO()
    alice = agent_owner("alice")

    call_command("create_tenant", "acme", "--token-name", "billing-bot", "--owner", "alice", stdout=out)

    raw = out.getvalue().strip().splitlines()[-1]
    token = ApiToken.objects.get()
    assert raw.startswith("idm_") and token.name == "billing-bot" and token.owner == alice
    assert token.digest == hashlib.sha256(raw.encode()).hexdigest()
    assert raw not in str(list(ApiToken.objects.values()))
    assert access.authenticate_token(raw) == token
    assert AuditEvent.objects.filter(action="token.issued", object_id=str(token.pk)).exists()


@pytest.mark.django_db
def test_issue_token_refuses_an_unknown_tenant():
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="no tenant"):
        call_command("issue_token", "nobody", "bot", "--owner", agent_owner().username)


@pytest.mark.django_db
def test_a_token_is_issued_only_with_an_owner_who_exists():
    from django.core.management.base import CommandError

    access.create_tenant("acme")

    with pytest.raises(CommandError, match="--owner"):
        call_command("issue_token", "acme", "bot")
    with pytest.raises(CommandError, match="no user 'ghost'"):
        call_command("issue_token", "acme", "bot", "--owner", "ghost")
    with pytest.raises(CommandError, match="--owner"):
        call_command("create_tenant", "globex")
    with pytest.raises(ValueError, match="needs an owner"):
        access.issue_token(Tenant.objects.get(), "bot", owner=None)
    assert not ApiToken.objects.exists() and not Tenant.objects.filter(slug="globex").exists()


@pytest.mark.django_db
def test_set_token_owner_hands_an_agent_to_another_person_and_audits_it():
    tenant = access.create_tenant("acme")
    token, _ = access.issue_token(tenant, "bot", owner=agent_owner("alice"))
    bob = agent_owner("bob")
    out = io.StringIO()

    call_command("set_token_owner", "acme", "bot", "bob", "--reason", "alice moved teams", stdout=out)
    call_command("set_token_owner", "acme", "bot", "bob", stdout=out)

    assert ApiToken.objects.get().owner == bob
    assert "now owned by bob" in out.getvalue() and "already owned by bob" in out.getvalue()
    event = AuditEvent.objects.get(action="token.owner_changed")
    assert (event.before, event.after, event.reason) == ({"owner": "alice"}, {"owner": "bob"}, "alice moved teams")
    assert access.owner_id_of(tenant.pk, token.agent_identity) == bob.pk


@pytest.mark.django_db
def test_the_demo_is_created_once_and_its_token_works(settings, tmp_path):
    override_conf(settings, var_dir=tmp_path)

    first, second = ensure_demo(), ensure_demo()

    assert first == second
    assert Tenant.objects.filter(slug="demo").count() == 1
    assert User.objects.filter(username="admin", is_superuser=True).count() == 1
    token = access.authenticate_token(second["token"])
    assert token.tenant.slug == "demo" and token.owner.username == "admin"
    # four eyes in the demo: the agent's owner cannot approve its requests, alice can
    alice = User.objects.get(username="alice")
    assert alice.email and alice.has_perm("tools_app.decide_approvalrequest") and not alice.is_superuser
    assert (tmp_path / "demo-credentials.json").stat().st_mode & 0o077 == 0
    # a large approval asks for a fresh code: the demo has a step-up amount, below the banner's payment
    assert ApprovalSettings.objects.get(tenant__slug="demo").step_up_amount == DEMO_STEP_UP_AMOUNT < 2500
    # both people are enrolled with an authenticator whose secret the banner prints: its code verifies
    for role, person in (("admin", "admin"), ("approver", "alice")):
        device = TOTPDevice.objects.get(user__username=person, confirmed=True)
        secret = second[f"{role}_totp_secret"]
        assert second[f"{role}_otpauth_uri"] == device.config_url and f"secret={secret}" in device.config_url
        assert device.verify_token(f"{TOTP(base64.b32decode(secret)).token():06d}")


@pytest.mark.django_db
def test_a_revoked_token_no_longer_authenticates():
    tenant = access.create_tenant("acme")
    token, raw = access.issue_token(tenant, "bot", owner=agent_owner())

    assert access.revoke_token(token, actor="user:ops", reason="leaked")
    assert access.authenticate_token(raw) is None
    assert not access.revoke_token(token, actor="user:ops")  # already revoked: nothing happens twice


def test_make_runs_banner_points_a_new_operator_at_the_console_its_queues_and_the_approver():
    text = banner("http://127.0.0.1:8000", {"admin_user": "admin", "admin_password": "pw-admin",
                                            "approver_user": "alice", "approver_password": "pw-alice",
                                            "approver_totp_secret": "SECRETALICE",
                                            "approver_otpauth_uri": "otpauth://totp/idemops:alice",
                                            "token": "idm_demo"})

    assert "Console   http://127.0.0.1:8000/admin/" in text
    for queue in ("pending approvals", "UNKNOWN", "failed or stuck tasks", "dead letters"):
        assert queue in text
    assert "finds any record by idempotency key" in text
    assert "user alice  password pw-alice" in text and "emailed" in text
    assert "authenticator secret SECRETALICE  otpauth://totp/idemops:alice" in text
    assert '"name":"request_payment"' in text and "http://127.0.0.1:8002/messages" in text


def test_an_operator_pauses_and_resumes_a_tool_from_the_shell_on_their_own_authority(transactional_db):
    import subprocess

    from tests.support.operators import make_operator
    from tests.support.processes import manage
    from tools_app.access.roles import OPERATOR
    from tools_app.incidents.models import Pause

    User.objects.create_superuser("root", password="pw")
    make_operator("alice", OPERATOR, access.create_tenant("acme"))

    paused = manage("pause", "--tool", "create_order", "--reason", "bad prices", "--user", "root", env={})
    listed = manage("pause", "--list", env={})
    pause = Pause.objects.get()
    with pytest.raises(subprocess.CalledProcessError) as not_everyones:  # alice sees acme only
        manage("resume", "--tool", "create_order", "--user", "alice", env={})
    with pytest.raises(subprocess.CalledProcessError) as unknown:
        manage("pause", "--tool", "create_ordr", "--reason", "typo", "--user", "root", env={})
    still = Pause.objects.count()
    resumed = manage("resume", "--tool", "create_order", "--reason", "fixed", "--user", "root", env={})

    assert "paused tool create_order" in paused.stdout
    assert (pause.scope, pause.target, pause.reason, pause.paused_by) == ("tool", "create_order", "bad prices",
                                                                          "user:root")
    assert "paused tool create_order by user:root" in listed.stdout and "bad prices" in listed.stdout
    assert "not resumed" in not_everyones.value.stderr and "no tool named 'create_ordr'" in unknown.value.stderr
    assert still == 1 and "resumed tool create_order" in resumed.stdout and not Pause.objects.exists()
    assert list(AuditEvent.objects.filter(action__startswith="pause.").order_by("seq").values_list(
        "action", "actor")) == [("pause.started", "user:root"), ("pause.refused", "user:alice"),
                                ("pause.ended", "user:root")]
