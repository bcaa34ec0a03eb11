"""The "Downstream systems" page: operators pause and resume a tool, a downstream system or a tenant's
writes and close a circuit breaker by hand, each through the concept functions, which refuse (403,
audited, nothing changed) a crafted request without the permission, the tenant or a second factor; the
page shows the breakers and pauses, and says so when their state cannot be read."""

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test import Client
from django.urls import reverse
from prometheus_client.parser import text_string_to_metric_families

from idemops_demo.models import Order
from tests.support.issued_ids import call_labelled
from tests.support.operators import PASSWORD, make_operator, verified
from tools_app import incidents
from tools_app.access.roles import OPERATOR
from tools_app.conf import override_conf
from tools_app.core import db
from tools_app.incidents.models import BreakerState, Downstream, Pause, PauseScope
from tools_app.models import AuditEvent, IdempotencyRecord, Tenant, TenantAccess

PAGE = reverse("admin:tools_app_downstream_changelist")
PAUSE = reverse("admin:tools_app_downstream_pause")


def superuser(username="root"):
    return User.objects.create_superuser(username, password=PASSWORD)


def viewer(username="vic"):
    """Staff who may look at the page (granted acme), without the permission to pause."""
    user = User.objects.create_user(username, password=PASSWORD, is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_downstream"))
    TenantAccess.objects.create(user=user, tenant=Tenant.objects.get(slug="acme"))
    return user


def refusals():
    return AuditEvent.objects.filter(action="pause.refused").count()


def open_breaker(name="payment-gateway"):
    """The breaker of `name` opened as the system opens it: failures counted until the threshold."""
    for _ in range(3):
        incidents.record_failure(name, "ConnectError: connection refused")
    return Downstream.objects.get(name=name)


@pytest.fixture
def breakers(settings):
    override_conf(settings, breaker_failures=3, breaker_open_seconds=300)


def test_a_crafted_pause_or_resume_without_the_permission_is_refused_audited_and_changes_nothing(client, tenant):
    standing = incidents.pause(PauseScope.TOOL, "create_ticket", verified(superuser()), reason="spam wave")
    client.force_login(viewer())

    page = client.get(PAGE)
    refused = client.post(PAUSE, {"scope": "tenant", "target": "acme", "reason": "gateway down"})
    not_resumed = client.post(reverse("admin:tools_app_downstream_resume", args=[standing.pk]), {"reason": "x"})

    assert page.status_code == 200 and b"pause-link" not in page.content and b"Resume" not in page.content
    assert refused.status_code == not_resumed.status_code == 403
    assert list(Pause.objects.values_list("scope", "target")) == [("tool", "create_ticket")] and refusals() == 2
    assert AuditEvent.objects.filter(action__in=["pause.started", "pause.ended"]).count() == 1


def test_a_crafted_pause_without_a_second_factor_is_refused_audited_and_changes_nothing(client, tenant):
    alice = make_operator("alice", OPERATOR, tenant)
    client.force_login(alice, second_factor=False)

    form = client.get(PAUSE)
    refused = client.post(PAUSE, {"scope": "tenant", "target": "acme", "reason": "gateway down"})

    assert form.status_code == 302 and reverse("admin:second_factor") in form["Location"]
    assert refused.status_code == 403
    assert Pause.objects.count() == 0
    event = AuditEvent.objects.get(action="pause.refused")
    assert "second" in event.reason and event.actor == "user:alice"


def test_an_operator_pauses_and_resumes_a_tenants_writes_audited_and_the_page_lists_the_pause(client, tenant):
    client.force_login(make_operator("alice", OPERATOR, tenant))

    paused = client.post(PAUSE, {"scope": "tenant", "target": "acme", "reason": "billing migration"})
    page = client.get(PAGE).content.decode()
    row = Pause.objects.get()
    resumed = client.post(reverse("admin:tools_app_downstream_resume", args=[row.pk]), {"reason": "done"})

    assert paused.status_code == 302 and resumed.status_code == 302
    assert (row.scope, row.tenant, row.reason, row.paused_by) == ("tenant", tenant, "billing migration",
                                                                  "user:alice")
    assert "tenant acme" in page and "billing migration" in page
    assert Pause.objects.count() == 0
    started, ended = AuditEvent.objects.get(action="pause.started"), AuditEvent.objects.get(action="pause.ended")
    assert started.actor == ended.actor == "user:alice" and started.tenant_id == tenant.pk
    assert ended.reason == "done" and refusals() == 0


def test_an_operator_of_some_tenants_may_not_pause_a_tool_for_every_tenant_nor_another_tenant(client, tenant,
                                                                                           other_tenant):
    client.force_login(make_operator("alice", OPERATOR, tenant))

    tool = client.post(PAUSE, {"scope": "tool", "target": "create_order", "reason": "bad release"})
    other = client.post(PAUSE, {"scope": "tenant", "target": "globex", "reason": "bad release"})

    assert tool.status_code == other.status_code == 403
    assert Pause.objects.count() == 0 and refusals() == 2


def test_a_pause_must_name_a_tool_or_downstream_the_registry_knows(client, tenant):
    client.force_login(superuser())

    unknown = client.post(PAUSE, {"scope": "tool", "target": "create_ordr", "reason": "bad release"})
    known = client.post(PAUSE, {"scope": "downstream", "target": "payment-gateway", "reason": "gateway down"})

    assert unknown.status_code == 200 and "no tool named &#x27;create_ordr&#x27;" in unknown.content.decode()
    assert known.status_code == 302
    assert list(Pause.objects.values_list("scope", "target")) == [("downstream", "payment-gateway")]


def test_a_paused_tenant_is_told_transient_with_the_reason_and_nothing_runs(client, tenant, caller):
    client.force_login(superuser())
    client.post(PAUSE, {"scope": "tenant", "target": "acme", "reason": "billing migration"})

    result = call_labelled(caller, "create_order", {"customer": "ACME", "currency": "EUR", "idempotency_key": "o-1",
                                                    "items": [{"sku": "A", "quantity": 1, "unit_price": "1.00"}]})

    assert result.error is not None and result.error.error_class == "transient"
    assert "billing migration" in result.error.message and result.error.retry_after is not None
    assert IdempotencyRecord.objects.count() == 0 and Order.objects.count() == 0  # no run, none counted


def test_the_page_shows_each_breaker_and_an_operator_closes_an_open_one_by_hand_audited(client, tenant, breakers):
    breaker = open_breaker()
    client.force_login(superuser())

    page = client.get(PAGE).content.decode()
    closed = client.post(reverse("admin:tools_app_downstream_close", args=[breaker.pk]),
                         {"reason": "their status page says it is back"})

    assert "payment-gateway" in page and "Open: calls answer transient" in page and "connection refused" in page
    assert "could not be read" not in page
    assert closed.status_code == 302
    breaker.refresh_from_db()
    assert breaker.state == BreakerState.CLOSED and breaker.failures == 0
    event = AuditEvent.objects.get(action="breaker.closed")
    assert event.actor == "user:root" and event.reason == "their status page says it is back"


def test_closing_a_breaker_without_the_permission_or_a_second_factor_is_refused_and_changes_nothing(
        client, tenant, breakers):
    breaker = open_breaker()
    close = reverse("admin:tools_app_downstream_close", args=[breaker.pk])
    client.force_login(viewer())
    without_permission = client.post(close, {"reason": "back"})
    root = Client()
    root.force_login(superuser())  # the plain client: a password only

    without_second_factor = root.post(close, {"reason": "back"})

    assert without_permission.status_code == without_second_factor.status_code == 403
    breaker.refresh_from_db()
    assert breaker.state == BreakerState.OPEN and refusals() == 2
    assert not AuditEvent.objects.filter(action="breaker.closed").exists()


@pytest.mark.live
def test_a_corrupt_breaker_row_lets_calls_run_as_normal_and_the_page_says_the_state_could_not_be_read(
        client, tenant, caller, downstreams, gateway):
    with connection.cursor() as cursor:
        cursor.execute(f"INSERT INTO {db.table(Downstream)} (name, state, failures, last_failure, updated_at) "
                       "VALUES ('payment-gateway', 'bogus', 7, '', now())")
    client.force_login(superuser())

    page = client.get(PAGE).content.decode()
    paid = call_labelled(caller, "request_payment", {"amount": "5.00", "currency": "EUR", "payee": "Bob",
                                                     "idempotency_key": "p-1"})

    assert "incident-state-problem" in page and "could not be read" in page and "bogus" in page
    assert paid.error is None and len(gateway.payments()) == 1


def test_metrics_show_each_breaker_and_the_pauses_by_scope_without_naming_a_tenant(client, tenant, breakers):
    open_breaker("mail.acme.example")
    incidents.pause(PauseScope.TENANT, "acme", make_operator("alice", OPERATOR, tenant), reason="migration")

    found = {family.name: family.samples for family in text_string_to_metric_families(
        Client(REMOTE_ADDR="127.0.0.1").get("/metrics").content.decode())}

    breakers_open = {s.labels["downstream"]: s.value for s in found["idemops_downstream_breaker_open"]}
    pauses = {s.labels["scope"]: s.value for s in found["idemops_pauses"]}
    # The declared one by name (at zero), one only a host names among the undeclared.
    assert breakers_open == {"payment-gateway": 0.0, "undeclared": 1.0}
    assert pauses == {"tool": 0.0, "downstream": 0.0, "tenant": 1.0}
    assert all("acme" not in str(s.labels) for name in ("idemops_pauses", "idemops_downstream_breaker_open")
               for s in found[name])
