"""Operators resolve UNKNOWN outcomes in the admin; every decision is audited."""

from decimal import Decimal

import httpx2
import pytest
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.urls import reverse

from tests.support.issued_ids import call_labelled
from tests.support.operators import make_operator
from tools_app import access, reconciliation
from tools_app.access.roles import OPERATOR
from tools_app.conf import override_conf
from tools_app.core import counters
from tools_app.core.errors import InvalidInput, PermissionDenied
from tools_app.models import AuditEvent, IdempotencyRecord, MetricTotal, RecordStatus, Tenant, TenantAccess
from tools_app.toolkit.calls import Caller
from tools_app.toolkit.registry import get_tool, sent_call

pytestmark = pytest.mark.live
QUEUE = reverse("admin:tools_app_unknownoutcomequeue_changelist")


@pytest.fixture
def unknown_payment(db, downstreams, gateway, settings):
    """A payment the gateway made but whose answer never arrived (after the 1 s the fixture `downstreams` allows);
    the reconciler's lookups that follow may take longer on a busy machine, so they are given 30 s."""
    tenant = access.create_tenant("acme")
    gateway.set_fault("*", "succeed-then-hang", times=1)
    result = call_labelled(Caller(tenant.pk, "agent:acme/bot"), "request_payment", {
        "amount": "99.00", "currency": "EUR", "payee": "Bob", "idempotency_key": "pay-unknown"})
    assert result.error.error_class == "unknown_outcome"
    override_conf(settings, payment_gateway_timeout_seconds=30.0)
    return IdempotencyRecord.objects.get(tool="request_payment")


def operator(username, tenant="acme"):
    """A user in the operator role, granted `tenant` (operators see only granted tenants)."""
    return make_operator(username, OPERATOR, Tenant.objects.get_or_create(slug=tenant, name=tenant)[0])


def viewer(username):
    """A staff user who may look at the queue, granted acme, without the permission to resolve."""
    user = User.objects.create_user(username, password="pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_unknownoutcomequeue"))
    TenantAccess.objects.create(user=user, tenant=Tenant.objects.get(slug="acme"))
    return user


def run_action(client, action, record, **form):
    response = client.post(QUEUE, {"action": action, "_selected_action": [record.pk]})
    assert response.status_code == 200 and b"operator-action-form" in response.content  # the reason form
    return client.post(QUEUE, {"action": action, "_selected_action": [record.pk], "confirm": "yes", **form})


def test_the_queue_lists_unknown_records_oldest_first_with_evidence(client, unknown_payment):
    client.force_login(operator("alice"))

    response = client.get(QUEUE)

    assert response.status_code == 200
    content = response.content.decode()
    assert "request_payment" in content and "ReadTimeout" in content


def test_an_operator_resolves_as_failed_with_a_reason_and_it_is_audited(client, unknown_payment):
    client.force_login(operator("alice"))

    response = run_action(client, "resolve_failed", unknown_payment, reason="bank says no such transfer")

    assert response.status_code == 302
    unknown_payment.refresh_from_db()
    assert (unknown_payment.status, unknown_payment.error_class) == (RecordStatus.FAILED, "transient")
    event = AuditEvent.objects.get(action="record.reconciled", object_id=str(unknown_payment.pk))
    assert (event.actor, event.reason) == ("user:alice", "bank says no such transfer")
    assert unknown_payment.evidence[-1]["actor"] == "user:alice"


def test_an_operator_resolves_as_succeeded_with_the_payment_reference(client, unknown_payment, gateway):
    client.force_login(operator("alice"))
    payment_id = gateway.payments()[0][0]

    run_action(client, "resolve_succeeded", unknown_payment, reason="found in the gateway dashboard",
               downstream_reference=payment_id)

    unknown_payment.refresh_from_db()
    assert unknown_payment.status == RecordStatus.SUCCEEDED
    assert unknown_payment.result["payment_id"] == payment_id


def test_reconcile_now_asks_the_gateway(client, unknown_payment, gateway):
    client.force_login(operator("alice"))

    run_action(client, "reconcile", unknown_payment)

    unknown_payment.refresh_from_db()
    assert unknown_payment.status == RecordStatus.SUCCEEDED
    assert unknown_payment.result["payment_id"] == gateway.payments()[0][0]


def test_an_operator_does_not_see_other_tenants_records(client, unknown_payment):
    client.force_login(operator("carol", tenant="globex"))

    response = client.get(QUEUE)

    assert response.status_code == 200
    assert list(response.context["cl"].result_list) == []


def test_without_the_permission_the_admin_offers_no_resolution(client, unknown_payment):
    client.force_login(viewer("bob"))

    listing = client.get(QUEUE)
    client.post(QUEUE, {"action": "resolve_failed", "_selected_action": [unknown_payment.pk], "confirm": "yes",
                        "reason": "trust me"})

    offered = {name for name, _ in listing.context["cl"].model_admin.get_action_choices(listing.wsgi_request)}
    assert listing.status_code == 200 and not offered & {"reconcile", "resolve_succeeded", "resolve_failed"}
    unknown_payment.refresh_from_db()
    assert unknown_payment.status == RecordStatus.UNKNOWN


def test_a_resolution_without_the_permission_is_refused_and_audited(unknown_payment):
    with pytest.raises(PermissionDenied):
        reconciliation.resolve_by_operator(unknown_payment, viewer("bob"), succeeded=False, reason="trust me")

    unknown_payment.refresh_from_db()
    assert unknown_payment.status == RecordStatus.UNKNOWN
    refused = AuditEvent.objects.get(action="record.resolve_refused")
    assert refused.actor == "user:bob" and "permission" in refused.reason


def test_an_operator_of_another_tenant_cannot_resolve(unknown_payment):
    carol = operator("carol", tenant="globex")

    with pytest.raises(PermissionDenied):
        reconciliation.resolve_by_operator(unknown_payment, carol, succeeded=False, reason="not mine")
    assert IdempotencyRecord.objects.get(pk=unknown_payment.pk).status == RecordStatus.UNKNOWN


def test_a_reconciler_that_lost_the_race_reports_the_records_real_state_not_its_own(unknown_payment, gateway):
    stale = IdempotencyRecord.objects.get(pk=unknown_payment.pk)
    # given another reconciler settled the record first (the gateway has the payment)
    assert reconciliation.reconcile_record(unknown_payment) == "succeeded"
    gateway.reset()  # now the gateway would answer "not found": a second, late answer must not win

    assert reconciliation.reconcile_record(stale) == "succeeded"

    unknown_payment.refresh_from_db()
    assert unknown_payment.status == RecordStatus.SUCCEEDED
    assert AuditEvent.objects.filter(action="record.reconciled", object_id=str(unknown_payment.pk)).count() == 1


def reconciliations_counted(record) -> int:
    counters.flush()
    return sum(MetricTotal.objects.filter(metric=counters.RECONCILIATION.name, tool=record.tool)
               .values_list("count", flat=True))


def test_a_reconciler_that_lost_the_race_counts_no_second_reconciliation(
        unknown_payment, gateway, django_capture_on_commit_callbacks):
    stale = IdempotencyRecord.objects.get(pk=unknown_payment.pk)
    before = reconciliations_counted(unknown_payment)
    # given another reconciler settled the record first
    with django_capture_on_commit_callbacks(execute=True):
        reconciliation.reconcile_record(unknown_payment)

    # when the late one finds it settled
    with django_capture_on_commit_callbacks(execute=True):
        reconciliation.reconcile_record(stale)

    # then idemops_reconciliations_total went up once, not twice
    assert reconciliations_counted(unknown_payment) - before == 1


def test_succeeded_needs_the_reference_of_the_payment_this_call_asked_for(unknown_payment, gateway):
    """The demo's `payment_for_reference` reads the call's own arguments (a SentCall's `args`, decrypted from
    the record): a payment of another amount is refused, and the record stays UNKNOWN."""
    other = httpx2.post(f"{gateway.url}/payments", json={"amount": "5.00", "currency": "EUR", "payee": "Eve"},
                        headers={"Idempotency-Key": "another-payment"}, timeout=10).json()["payment_id"]
    # the payee is stored encrypted; what the tool is given is the call's own
    assert "Bob" not in raw_arguments(unknown_payment)
    call = sent_call(IdempotencyRecord.objects.get(pk=unknown_payment.pk), get_tool("request_payment"))
    assert (call.args.amount, call.args.payee, call.args.currency) == (Decimal("99"), "Bob", "EUR")

    with pytest.raises(InvalidInput, match=r"is of 5.00 EUR, not the 99.00 EUR this call asked for"):
        reconciliation.resolve_by_operator(unknown_payment, operator("alice"), succeeded=True,
                                           reason="found in the gateway dashboard", downstream_reference=other)
    unknown_payment.refresh_from_db()
    assert unknown_payment.status == RecordStatus.UNKNOWN


def raw_arguments(record: IdempotencyRecord) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT arguments::text FROM tools_app_idempotencyrecord WHERE id = %s", [record.pk])
        return cursor.fetchone()[0]
