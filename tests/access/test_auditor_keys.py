"""Auditor keys are issued (shown once), granted tenants and revoked from a command or the admin, audited."""

import io

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from tools_app.access import auditors, secrets
from tools_app.models import AuditEvent, AuditorKey

pytestmark = pytest.mark.django_db


def api_status(raw_key: str) -> int:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw_key}")
    return client.get("/api/v1/idempotency-records").status_code


def test_the_command_prints_a_working_key_once_and_stores_its_digest(tenant, other_tenant):
    out = io.StringIO()

    call_command("issue_auditor_key", "firm", "--tenant", "acme", "--tenant", "globex", stdout=out,
                 stderr=io.StringIO())

    raw = out.getvalue().strip()
    key = AuditorKey.objects.get(name="firm")
    assert raw.startswith("ida_") and key.digest == secrets.digest(raw)
    assert sorted(key.tenants.values_list("slug", flat=True)) == ["acme", "globex"]
    assert api_status(raw) == 200
    event = AuditEvent.objects.get(action="auditor_key.issued")
    assert event.actor == "system:issue-auditor-key" and event.after["tenants"] == ["acme", "globex"]


def test_the_command_refuses_an_unknown_tenant(tenant):
    with pytest.raises(CommandError, match="no tenant nope"):
        call_command("issue_auditor_key", "firm", "--tenant", "acme", "--tenant", "nope", stdout=io.StringIO())

    assert not AuditorKey.objects.exists()


def test_the_revoke_command_shuts_the_key_out(tenant):
    _, raw = auditors.issue_key("firm", [tenant], actor="system:test")

    call_command("revoke_auditor_key", "firm", "--reason", "engagement over", stdout=io.StringIO())

    assert api_status(raw) == 401
    assert AuditEvent.objects.get(action="auditor_key.revoked").reason == "engagement over"
    with pytest.raises(CommandError, match="already revoked"):
        call_command("revoke_auditor_key", "firm", stdout=io.StringIO())


@pytest.fixture
def admin_client_(db):
    user = User.objects.create_superuser("root", password="pw")
    client = APIClient()
    client.force_login(user)
    return client


def test_the_admin_shows_a_new_key_once_and_never_again(admin_client_, tenant):
    response = admin_client_.post("/admin/tools_app/auditorkey/add/", {"name": "firm", "tenants": [tenant.pk]})

    assert response.status_code == 200
    raw = response.content.decode().split('<code id="auditor-key">')[1].split("</code>")[0]
    key = AuditorKey.objects.get(name="firm")
    assert key.digest == secrets.digest(raw) and list(key.tenants.all()) == [tenant]
    assert api_status(raw) == 200
    change_page = admin_client_.get(f"/admin/tools_app/auditorkey/{key.pk}/change/").content.decode()
    assert raw not in change_page and key.prefix in change_page
    assert AuditEvent.objects.get(action="auditor_key.issued").actor == "user:root"


def test_changing_tenants_in_the_admin_is_audited_and_takes_effect(admin_client_, tenant, other_tenant):
    key, raw = auditors.issue_key("firm", [tenant], actor="system:test")

    response = admin_client_.post(f"/admin/tools_app/auditorkey/{key.pk}/change/", {"tenants": [other_tenant.pk]})

    assert response.status_code == 302
    assert list(key.tenants.values_list("slug", flat=True)) == ["globex"]
    event = AuditEvent.objects.get(action="auditor_key.tenants_changed")
    assert (event.before, event.after, event.actor) == ({"tenants": ["acme"]}, {"tenants": ["globex"]}, "user:root")


def test_the_admin_revoke_action_revokes_and_keys_cannot_be_deleted(admin_client_, tenant):
    key, raw = auditors.issue_key("firm", [tenant], actor="system:test")

    admin_client_.post("/admin/tools_app/auditorkey/", {"action": "revoke_selected", "_selected_action": [key.pk]})

    assert api_status(raw) == 401
    assert AuditEvent.objects.get(action="auditor_key.revoked").actor == "user:root"
    assert admin_client_.get(f"/admin/tools_app/auditorkey/{key.pk}/delete/").status_code == 403
