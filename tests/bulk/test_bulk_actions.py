"""Bulk recovery by filter: the count first (a dry run in SQL), then one audited action over a frozen
selection, run in batches by the job function as the cluster runs it, with its progress, a stop between
batches, and the refusals of crafted requests (no permission, no second factor, no step-up for money)."""

from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission, User
from django.urls import reverse
from django.utils import timezone
from django_q.models import OrmQ

from tests.bulk.support import run_to_the_end, unknown_records
from tests.support.operators import PASSWORD, make_operator, verified, verify_session
from tools_app import bulk
from tools_app.access.roles import OPERATOR
from tools_app.conf import override_conf
from tools_app.core.errors import InvalidInput, PermissionDenied
from tools_app.models import AuditEvent, IdempotencyRecord, RecordStatus, TenantAccess

pytestmark = pytest.mark.django_db

NEW = reverse("admin:tools_app_bulkaction_new")


def unknown(**filters):
    return bulk.Filter(target=bulk.Target.UNKNOWN, **filters)


def still_unknown():
    return IdempotencyRecord.objects.filter(status=RecordStatus.UNKNOWN).count()


def test_the_dry_run_counts_what_each_filter_selects_within_the_operators_tenants(tenant, other_tenant):
    long_ago = timezone.now() - timedelta(days=3)
    unknown_records(tenant, 30, attributes={"order_id": "42"})
    unknown_records(tenant, 20, tool="request_payment", created_at=long_ago)
    unknown_records(other_tenant, 7)
    alice = make_operator("alice", OPERATOR, tenant)

    assert bulk.count(unknown(), alice) == 50  # the other tenant's 7 are not hers
    assert bulk.count(unknown(tool="request_payment"), alice) == 20
    assert bulk.count(unknown(downstream="payment-gateway"), alice) == 20
    assert bulk.count(unknown(attributes={"order_id": "42"}), alice) == 30
    assert bulk.count(unknown(attributes={"order_id": "43"}), alice) == 0
    assert bulk.count(unknown(created_before=timezone.now() - timedelta(days=1)), alice) == 20
    assert bulk.count(unknown(error_class="unknown_outcome", tenant="acme"), alice) == 50
    assert bulk.count(bulk.Filter(target=bulk.Target.DEAD_LETTERS), alice) == 0


def test_the_console_shows_the_count_first_and_nothing_matches_offers_no_action(client, tenant):
    unknown_records(tenant, 12)
    client.force_login(make_operator("alice", OPERATOR, tenant))

    counted = client.post(NEW, {"target": "unknown", "tool": "send_notification", "count": "1"}).content.decode()
    none = client.post(NEW, {"target": "unknown", "tool": "create_ticket", "count": "1"}).content.decode()

    assert "<strong>12</strong> matches" in counted and "confirm-bulk" in counted
    assert "Nothing matches this filter" in none and "confirm-bulk" not in none
    assert bulk.BulkAction.objects.count() == 0  # a count changes nothing


def test_an_invalid_filter_is_shown_as_form_errors_and_starts_nothing(client, tenant):
    unknown_records(tenant, 3)
    client.force_login(make_operator("alice", OPERATOR, tenant))

    page = client.post(NEW, {"target": "unknown", "attribute": "customer=Jane", "created_after": "yesterday",
                             "confirm": "1", "action": "resolve_not_done", "reason": "checked"})

    text = page.content.decode()
    assert page.status_code == 200 and "no tool declares the search field" in text and "Enter a valid date" in text
    assert bulk.BulkAction.objects.count() == 0 and still_unknown() == 3


def test_resolve_as_not_done_over_many_records_runs_in_batches_with_progress_audited_once_each(
        client, tenant, settings):
    override_conf(settings, bulk_batch_size=500)
    unknown_records(tenant, 1200)
    alice = make_operator("alice", OPERATOR, tenant)
    client.force_login(alice)

    confirmed = client.post(NEW, {"target": "unknown", "confirm": "1", "action": "resolve_not_done",
                                  "reason": "the gateway's log shows none of them arrived"})
    action = bulk.BulkAction.objects.get()
    unknown_records(tenant, 5)  # matches later: not in the frozen selection
    progress = run_to_the_end(action.pk)
    page = client.get(reverse("admin:tools_app_bulkaction_progress", args=[action.pk])).content.decode()

    assert confirmed.status_code == 302 and action.total == 1200 and action.actor == "user:alice"
    assert OrmQ.objects.count() >= 1  # its first batch was queued for the cluster
    assert progress == [(500, 0, "running"), (1000, 0, "running"), (1200, 0, "done")]
    assert still_unknown() == 5
    resolved = IdempotencyRecord.objects.filter(status=RecordStatus.FAILED)
    assert resolved.count() == 1200 and all(
        record.evidence[-1]["reason"] == "the gateway's log shows none of them arrived" for record in resolved)
    assert AuditEvent.objects.filter(action="record.reconciled", actor="user:alice").count() == 1200
    assert AuditEvent.objects.filter(action="bulk.started").count() == 1
    assert AuditEvent.objects.filter(action="bulk.finished").count() == 1
    assert "1200 of 1200 handled (100%)" in page and "Done" in page
    assert bulk.run_batch(action.pk) == {"handled": 0}  # a redelivered job handles nothing twice


def test_stop_takes_effect_between_batches_and_the_rest_is_left_as_it_was(client, tenant, settings):
    override_conf(settings, bulk_batch_size=100)
    unknown_records(tenant, 350)
    client.force_login(make_operator("alice", OPERATOR, tenant))
    client.post(NEW, {"target": "unknown", "confirm": "1", "action": "resolve_not_done", "reason": "checked"})
    action = bulk.BulkAction.objects.get()

    bulk.run_batch(action.pk)
    stopped = client.post(reverse("admin:tools_app_bulkaction_stop", args=[action.pk]))
    bulk.run_batch(action.pk)
    action.refresh_from_db()

    assert stopped.status_code == 302
    assert (action.state, action.done, action.failed) == ("stopped", 100, 0) and still_unknown() == 250
    assert AuditEvent.objects.filter(action="bulk.stop_requested", actor="user:alice").count() == 1
    assert AuditEvent.objects.filter(action="bulk.stopped").count() == 1
    assert bulk.run_batch(action.pk) == {"handled": 0} and still_unknown() == 250


def test_a_crafted_bulk_post_without_the_permission_or_a_second_factor_is_refused_audited_and_changes_nothing(
        client, tenant):
    unknown_records(tenant, 10)
    resolver = User.objects.create_user("rita", password=PASSWORD, is_staff=True)  # may resolve, not in bulk
    resolver.user_permissions.add(*Permission.objects.filter(codename__in=["resolve_unknown", "view_bulkaction"]))
    TenantAccess.objects.create(user=resolver, tenant=tenant)
    post = {"target": "unknown", "confirm": "1", "action": "resolve_not_done", "reason": "checked"}

    client.force_login(resolver)  # with a second factor
    no_permission = client.post(NEW, post)
    client.force_login(make_operator("alice", OPERATOR, tenant), second_factor=False)  # a password only
    no_second_factor = client.post(NEW, post)

    assert no_permission.status_code == no_second_factor.status_code == 403
    assert bulk.BulkAction.objects.count() == 0 and still_unknown() == 10
    refusals = AuditEvent.objects.filter(action="bulk.refused")
    assert {event.actor for event in refusals} == {"user:rita", "user:alice"}
    assert any("second factor" in event.reason for event in refusals)


def test_another_tenants_operator_neither_sees_nor_stops_a_bulk_action_crafted_requests_and_all(
        client, tenant, other_tenant, settings):
    # given: alice's action over acme's records, and bob, who holds the bulk permission for globex only
    override_conf(settings, bulk_batch_size=100)
    unknown_records(tenant, 250)
    client.force_login(make_operator("alice", OPERATOR, tenant))
    client.post(NEW, {"target": "unknown", "confirm": "1", "action": "resolve_not_done", "reason": "checked"})
    action = bulk.BulkAction.objects.get()
    bob = make_operator("bob", OPERATOR, other_tenant)
    client.force_login(bob)

    # when: bob asks for its progress page and its list, and posts Stop by hand (and through the function)
    progress = client.get(reverse("admin:tools_app_bulkaction_progress", args=[action.pk]))
    listed = client.get(reverse("admin:tools_app_bulkaction_changelist"))
    stop = client.post(reverse("admin:tools_app_bulkaction_stop", args=[action.pk]))
    with pytest.raises(PermissionDenied):
        bulk.stop(action, bob)

    # then: nothing shown, nothing stopped, the refusal audited; alice still sees and stops it
    assert progress.status_code == stop.status_code == 404
    assert list(listed.context["cl"].queryset) == []
    action.refresh_from_db()
    assert (action.state, action.tenant_ids) == ("running", [tenant.pk])
    assert AuditEvent.objects.filter(action="bulk.refused", actor="user:bob",
                                     reason__contains="a tenant you may not see").exists()
    client.force_login(User.objects.get(username="alice"))
    assert client.get(reverse("admin:tools_app_bulkaction_progress", args=[action.pk])).status_code == 200
    assert list(client.get(reverse("admin:tools_app_bulkaction_changelist")).context["cl"].queryset) == [action]
    assert client.post(reverse("admin:tools_app_bulkaction_stop", args=[action.pk])).status_code == 302
    action.refresh_from_db()
    assert action.state == "stopping"


def test_a_selection_with_a_money_tool_needs_a_fresh_second_factor(client, tenant, settings):
    override_conf(settings, step_up_minutes=10)
    unknown_records(tenant, 4, tool="request_payment")
    alice = make_operator("alice", OPERATOR, tenant)
    client.force_login(alice)
    verify_session(client, alice, at=timezone.now() - timedelta(minutes=30))
    post = {"target": "unknown", "confirm": "1", "action": "resolve_not_done", "reason": "checked"}

    stale = client.post(NEW, post)
    verify_session(client, alice)
    fresh = client.post(NEW, post)

    assert stale.status_code == 302 and "stale=1" in stale["Location"]
    assert fresh.status_code == 302 and "progress" in fresh["Location"]
    action = bulk.BulkAction.objects.get()
    assert action.stepped_up and action.total == 4
    assert AuditEvent.objects.filter(action="bulk.refused", reason__startswith="step-up").count() == 1


def test_an_item_the_per_item_rules_refuse_is_counted_as_not_done_with_its_reason(tenant):
    records = unknown_records(tenant, 3)
    alice = verified(make_operator("alice", OPERATOR, tenant))
    action = bulk.start(alice, unknown(), "resolve_not_done", reason="checked")
    IdempotencyRecord.objects.filter(pk=records[0].pk).update(status=RecordStatus.SUCCEEDED)  # settled meanwhile

    run_to_the_end(action.pk)
    action.refresh_from_db()

    assert (action.done, action.failed, action.state) == (2, 1, "done")
    assert "no longer UNKNOWN" in bulk.progress(action)["failures"][0][1]


def test_the_sweep_queues_again_a_running_action_whose_job_was_lost(tenant, settings):
    override_conf(settings, bulk_stall_minutes=5)
    unknown_records(tenant, 3)
    action = bulk.start(verified(make_operator("alice", OPERATOR, tenant)), unknown(), "resolve_not_done",
                        reason="checked")
    OrmQ.objects.all().delete()  # its job was lost with its cluster

    fresh = bulk.sweep()
    bulk.BulkAction.objects.filter(pk=action.pk).update(progress_at=timezone.now() - timedelta(minutes=6))
    stalled = bulk.sweep()

    assert (fresh, stalled) == (0, 1) and OrmQ.objects.count() == 1


def test_dead_lettered_events_are_re_delivered_in_bulk_and_an_error_class_filter_is_refused_for_them(tenant):
    from tools_app.outbox.models import OutboxEvent, OutboxStatus

    now = timezone.now()
    for n in range(6):
        OutboxEvent.objects.create(tenant=tenant, kind="notification.email", payload={"n": n}, attempts=8,
                                   status=OutboxStatus.DEAD if n < 5 else OutboxStatus.DELIVERED,
                                   next_attempt_at=now, created_at=now, last_error="HTTP 500")
    alice = verified(make_operator("alice", OPERATOR, tenant))
    dead = bulk.Filter(target=bulk.Target.DEAD_LETTERS)

    action = bulk.start(alice, dead, "redrive", reason="the receiver is fixed")
    run_to_the_end(action.pk)
    action.refresh_from_db()

    assert (action.total, action.done, action.failed, action.state) == (5, 5, 0, "done")
    assert OutboxEvent.objects.filter(status=OutboxStatus.PENDING, attempts=0).count() == 5
    assert AuditEvent.objects.filter(action="outbox.redriven", actor="user:alice").count() == 5
    with pytest.raises(InvalidInput, match="no error class"):
        bulk.count(bulk.Filter(target=bulk.Target.DEAD_LETTERS, error_class="transient"), alice)
