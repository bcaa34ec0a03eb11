"""Who gets in: a live auditor key or a user with the auditor permission; nobody writes."""

import pytest
from django.contrib.auth.models import Group, User
from rest_framework.test import APIClient

from tests.support.api_support import ENDPOINTS, key_client, make_row
from tests.support.operators import agent_owner
from tools_app import access
from tools_app.access import auditors, secrets
from tools_app.models import AuditEvent, AuditorKey

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("path", ["/api/v1/idempotency-records", "/api/v1/audit-events",
                                  "/api/v1/idempotency-records/export.csv", "/api/v1/audit-events/1"])
def test_it_answers_401_with_a_challenge_without_credentials(path):
    response = APIClient().get(path)

    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")


def test_it_answers_401_to_an_unknown_key(tenant):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Bearer ida_not-a-key-that-was-ever-issued")

    assert client.get("/api/v1/idempotency-records").status_code == 401


def test_it_answers_401_to_an_agents_mcp_token(tenant):
    _, raw_token = access.issue_token(tenant, "bot", owner=agent_owner())
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw_token}")

    assert client.get("/api/v1/idempotency-records").status_code == 401


def test_a_revoked_key_answers_401(tenant):
    client = key_client(tenant, name="firm")
    assert client.get("/api/v1/idempotency-records").status_code == 200

    revoked = auditors.revoke_key(AuditorKey.objects.get(name="firm"), actor="user:admin", reason="contract ended")

    assert revoked
    assert client.get("/api/v1/idempotency-records").status_code == 401
    assert client.get("/api/v1/idempotency-records/export.csv").status_code == 401
    event = AuditEvent.objects.get(action="auditor_key.revoked")
    assert (event.actor, event.reason) == ("user:admin", "contract ended")


def test_revoking_twice_changes_nothing_the_second_time(tenant):
    key, _ = auditors.issue_key("firm", [tenant], actor="user:admin")

    assert auditors.revoke_key(key, actor="user:admin") is True
    assert auditors.revoke_key(key, actor="user:admin") is False
    assert AuditEvent.objects.filter(action="auditor_key.revoked").count() == 1


def test_only_a_digest_of_the_key_is_stored(tenant):
    key, raw = auditors.issue_key("firm", [tenant], actor="user:admin")

    key.refresh_from_db()
    assert raw.startswith("ida_") and len(raw) > 40
    assert raw not in {key.digest, key.prefix} and key.digest == secrets.digest(raw)
    assert raw[:12] == key.prefix
    assert raw not in str(AuditEvent.objects.get(action="auditor_key.issued").after)


@pytest.mark.parametrize("endpoint", ENDPOINTS)
@pytest.mark.parametrize("method", ["post", "put", "patch", "delete"])
def test_a_write_with_a_valid_key_is_refused(endpoint, method, tenant):
    row = make_row(endpoint, tenant)
    client = key_client(tenant)
    path = f"/api/v1/{endpoint}" if method == "post" else f"/api/v1/{endpoint}/{row.pk}"

    response = getattr(client, method)(path, {"status": "succeeded"}, format="json")

    assert response.status_code == 405
    assert type(row).objects.filter(pk=row.pk).exists()


def test_a_session_write_is_refused_too(tenant):
    user = User.objects.create_superuser("root", password="pw")
    row = make_row("idempotency-records", tenant)
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(user)

    assert client.delete(f"/api/v1/idempotency-records/{row.pk}").status_code in (403, 405)
    assert client.post("/api/v1/audit-events", {}, format="json").status_code in (403, 405)
    assert type(row).objects.filter(pk=row.pk).exists()


def test_a_logged_in_user_without_the_auditor_permission_gets_403(tenant):
    user = User.objects.create_user("operator", password="pw")
    client = APIClient()
    client.force_login(user)

    assert client.get("/api/v1/idempotency-records").status_code == 403


def test_a_user_in_the_auditor_group_gets_in(tenant):
    user = User.objects.create_user("auditor", password="pw")
    user.groups.add(Group.objects.get(name="auditor"))
    client = APIClient()
    client.force_login(user)

    assert client.get("/api/v1/idempotency-records").status_code == 200


def test_the_auditor_group_holds_the_api_permission_and_nothing_that_writes():
    codenames = set(Group.objects.get(name=auditors.GROUP_NAME).permissions.values_list("codename", flat=True))

    assert "use_auditor_api" in codenames
    assert {c for c in codenames if c != "use_auditor_api" and not c.startswith("view_")} == set()
