"""The operators' admin through Django's test client: queues, actions, scoping, read-only evidence."""

from datetime import timedelta

import pytest
from django.contrib import admin
from django.contrib.auth.models import Group, Permission
from django.urls import reverse
from django.utils import timezone

from idemops_demo.models import Announcement, Order
from tests.support.issued_ids import call_labelled
from tests.support.jobs import queued_jobs, run_queued_jobs
from tests.support.operators import make_operator
from tools_app import approvals
from tools_app.access.roles import APPROVER, AUDITOR, OPERATOR, ROLE_PERMISSIONS
from tools_app.core import counters
from tools_app.core.errors import PermissionDenied
from tools_app.core.jobs import JOBS
from tools_app.models import (
    ApprovalRequest,
    ApprovalSettings,
    ApprovalStatus,
    AuditEvent,
    IdempotencyRecord,
    RecordStatus,
)
from tools_app.toolkit.calls import Caller, CallOutcome, call_tool
from tools_app.toolkit.registry import get_tool

QUEUE = reverse("admin:tools_app_approvalqueue_changelist")
NOTE = {"title": "Maintenance", "body": "Down at 2am", "audience": "staff"}


def ask(caller, key="a-1", **overrides) -> ApprovalRequest:
    result = call_labelled(caller, "publish_announcement", {"idempotency_key": key, **NOTE, **overrides})
    return ApprovalRequest.objects.get(pk=result.error.as_dict()["approval"]["request_id"])


def act_url(request, action):
    return reverse("admin:tools_app_approvalqueue_act", args=[request.pk, action])


def messages_of(response):
    return [str(m) for m in response.context["messages"]] if response.context else []


@pytest.fixture
def bob(tenant):
    return make_operator("bob", APPROVER, tenant)


@pytest.fixture
def as_bob(client, bob):
    client.force_login(bob)
    return client


# --- the pending approvals queue ------------------------------------------------------------


def test_the_queue_lists_pending_requests_oldest_first_with_what_an_approver_needs(caller, as_bob):
    older = ask(caller, "a-1", title="First")
    newer = ask(caller, "a-2", title="Second")
    ApprovalRequest.objects.filter(pk=older.pk).update(created_at=timezone.now() - timedelta(hours=2))

    response = as_bob.get(QUEUE)

    assert response.status_code == 200
    assert [r.pk for r in response.context["cl"].result_list] == [older.pk, newer.pk]
    page = response.content.decode()
    for column in ["summary", "tenant", "tool", "amount", "who asked", "age", "expires", "approvals"]:
        assert f">{column}<" in page.lower() or f"{column}</a>" in page.lower(), column
    assert "Publish to staff: “First”" in page and "agent:acme/test" in page and "2h 0m" in page
    assert "publish_announcement" in page and "acme" in page


def test_the_queue_searches_and_filters(caller, as_bob):
    ask(caller, "a-1", title="Quarterly results")
    ask(caller, "a-2", title="Lunch menu")

    found = as_bob.get(QUEUE, {"q": "quarterly"})
    filtered = as_bob.get(QUEUE, {"tool": "delete_record"})

    summaries = [r.summary for r in found.context["cl"].result_list]
    assert summaries == ["Publish to staff: “Quarterly results” (11 characters)"]
    assert list(filtered.context["cl"].result_list) == []


def test_an_approver_approves_from_the_list_and_the_request_leaves_the_queue(caller, as_bob):
    request = ask(caller)

    confirm = as_bob.post(QUEUE, {"action": "approve", "_selected_action": [request.pk], "index": "0"})
    assert confirm.status_code == 200 and b"operator-action-form" in confirm.content
    assert ApprovalRequest.objects.get().status == ApprovalStatus.PENDING  # nothing before confirming
    done = as_bob.post(QUEUE, {"action": "approve", "_selected_action": [request.pk], "index": "0",
                               "confirm": "yes", "reason": "checked with the team"}, follow=True)

    assert any("approved; it is being executed" in m for m in messages_of(done))
    assert request.pk not in [r.pk for r in done.context["cl"].result_list]
    assert ApprovalRequest.objects.get().status == ApprovalStatus.APPROVED
    run_queued_jobs()
    assert Announcement.objects.count() == 1


def test_an_approver_approves_from_the_request_page(caller, as_bob):
    request = ask(caller)

    page = as_bob.get(reverse("admin:tools_app_approvalqueue_change", args=[request.pk]))
    form = as_bob.get(act_url(request, "approve"))
    done = as_bob.post(act_url(request, "approve"), {"reason": ""})

    assert page.status_code == 200 and b'id="action-approve"' in page.content and b'id="action-reject"' in page.content
    assert b"Down at 2am" in page.content  # the arguments are shown
    assert form.status_code == 200 and request.summary.encode() in form.content
    assert done.status_code == 302 and done.url == QUEUE
    assert [job["func"] for job in queued_jobs()] == [JOBS["approvals.run_approved"]]


def test_a_rejection_without_a_reason_goes_back_to_the_form(caller, as_bob):
    request = ask(caller)

    missing = as_bob.post(act_url(request, "reject"), {"reason": ""})
    done = as_bob.post(act_url(request, "reject"), {"reason": "wrong date"}, follow=True)

    assert missing.status_code == 200 and b"This field is required" in missing.content
    assert any("rejected" in m for m in messages_of(done))
    request.refresh_from_db()
    assert (request.status, request.reason, request.decided_by) == (ApprovalStatus.REJECTED, "wrong date", "user:bob")


def test_an_operator_sees_no_decision_buttons_and_a_crafted_approval_is_refused_and_audited(caller, client, tenant):
    olga = make_operator("olga", OPERATOR, tenant)
    client.force_login(olga)
    request = ask(caller)

    page = client.get(reverse("admin:tools_app_approvalqueue_change", args=[request.pk]))
    queue = client.get(QUEUE)
    crafted = client.post(act_url(request, "approve"), {"reason": ""})

    assert page.status_code == 200 and b'id="action-approve"' not in page.content
    assert "approve" not in dict(queue.context["cl"].model_admin.get_action_choices(queue.wsgi_request))
    assert crafted.status_code == 403
    assert ApprovalRequest.objects.get().status == ApprovalStatus.PENDING
    refusal = AuditEvent.objects.get(action="approval.refused")
    assert (refusal.actor, refusal.object_id) == ("user:olga", str(request.pk))


def test_self_approval_through_the_admin_is_refused_and_audited(client, tenant):
    alice = make_operator("alice", APPROVER, tenant)
    request = ask(Caller(tenant_id=tenant.pk, actor="user:alice"))
    client.force_login(alice)

    response = client.post(act_url(request, "approve"), {"reason": ""}, follow=True)

    assert any("self-approval" in m for m in messages_of(response))
    assert ApprovalRequest.objects.get().status == ApprovalStatus.PENDING and queued_jobs() == []
    assert AuditEvent.objects.filter(action="approval.refused", actor="user:alice").count() == 1


def test_an_approver_sees_and_decides_only_their_tenants_requests(caller, client, other_tenant):
    gus = make_operator("gus", APPROVER, other_tenant)
    theirs = ask(Caller(tenant_id=other_tenant.pk, actor="agent:globex/x"), "g-1")
    mine_not = ask(caller, "a-1")
    client.force_login(gus)

    queue = client.get(QUEUE)

    assert [r.pk for r in queue.context["cl"].result_list] == [theirs.pk]
    assert client.get(reverse("admin:tools_app_approvalqueue_change", args=[mine_not.pk])).status_code == 302
    assert client.post(act_url(mine_not, "approve"), {"reason": ""}).status_code == 403
    records = client.get(reverse("admin:tools_app_idempotencyrecord_changelist"))
    assert {r.tenant_id for r in records.context["cl"].result_list} == {other_tenant.pk}
    assert ApprovalRequest.objects.get(pk=mine_not.pk).status == ApprovalStatus.PENDING


def test_two_approvals_from_the_admin_are_counted_then_executed(caller, client, tenant, bob):
    carol = make_operator("carol", APPROVER, tenant)
    request = ask(caller, audience="everyone")

    client.force_login(bob)
    first = client.post(act_url(request, "approve"), {"reason": ""}, follow=True)
    again = client.post(act_url(request, "approve"), {"reason": ""}, follow=True)
    client.force_login(carol)
    second = client.post(act_url(request, "approve"), {"reason": ""}, follow=True)

    assert any("approval counted (1 of 2)" in m for m in messages_of(first))
    assert any("already decided" in m for m in messages_of(again))
    assert any("approved; it is being executed" in m for m in messages_of(second))
    assert ApprovalRequest.objects.get().status == ApprovalStatus.APPROVED


# --- evidence is read-only ---------------------------------------------------------------------


def test_nobody_can_add_change_or_delete_audit_events_in_the_admin(client, django_user_model, tenant):
    client.force_login(django_user_model.objects.create_superuser("root", "r@example.invalid", "pw"))
    event = AuditEvent.objects.first()

    changelist = client.get(reverse("admin:tools_app_auditevent_changelist"))
    change = client.post(reverse("admin:tools_app_auditevent_change", args=[event.pk]), {"reason": "edited"})
    delete = client.post(reverse("admin:tools_app_auditevent_delete", args=[event.pk]), {"post": "yes"})
    add = client.get(reverse("admin:tools_app_auditevent_add"))
    bulk = client.post(reverse("admin:tools_app_auditevent_changelist"),
                       {"action": "delete_selected", "_selected_action": [event.pk], "index": "0", "post": "yes"})

    assert changelist.status_code == 200 and "delete_selected" not in changelist.context["cl"].model_admin.get_actions(
        changelist.wsgi_request)
    assert change.status_code == 403 and delete.status_code == 403 and add.status_code == 403
    assert bulk.status_code in (200, 302)
    assert AuditEvent.objects.get(pk=event.pk).reason == "" and AuditEvent.objects.filter(pk=event.pk).exists()


def test_a_record_page_shows_fingerprint_stored_result_attempts_and_history(caller, client, tenant):
    client.force_login(make_operator("olga", OPERATOR, tenant))
    call_tool(get_tool("create_ticket"), caller, {"idempotency_key": "t-1", "subject": "Printer", "body": "Jammed"})
    record = IdempotencyRecord.objects.get()

    page = client.get(reverse("admin:tools_app_idempotencyrecord_change", args=[record.pk]))
    edit = client.post(reverse("admin:tools_app_idempotencyrecord_change", args=[record.pk]), {"status": "failed"})

    body = page.content.decode()
    assert page.status_code == 200
    assert record.fingerprint in body and "&quot;ticket_id&quot;" in body and "record.succeeded" in body
    assert "t-1" not in body  # the key only as its digest
    assert edit.status_code == 403 and IdempotencyRecord.objects.get().status == RecordStatus.SUCCEEDED


def test_force_expire_needs_a_reason_is_audited_and_frees_the_key(caller, client, tenant):
    client.force_login(make_operator("olga", OPERATOR, tenant))
    first = call_tool(get_tool("create_ticket"), caller, {"idempotency_key": "t-1", "subject": "A", "body": "B"})
    record = IdempotencyRecord.objects.get()
    url = reverse("admin:tools_app_idempotencyrecord_act", args=[record.pk, "force_expire"])

    missing = client.post(url, {"reason": ""})
    done = client.post(url, {"reason": "customer asked to re-run"}, follow=True)
    again = call_tool(get_tool("create_ticket"), caller, {"idempotency_key": "t-1", "subject": "A", "body": "B"})

    assert missing.status_code == 200 and b"This field is required" in missing.content
    assert any("retention ended now" in m for m in messages_of(done))
    event = AuditEvent.objects.get(action="record.force_expired")
    assert (event.actor, event.reason, event.object_id) == ("user:olga", "customer asked to re-run", str(record.pk))
    assert again.result["ticket_id"] != first.result["ticket_id"] and not again.replayed


def test_force_expire_is_refused_for_a_record_awaiting_approval(caller, client, tenant):
    client.force_login(make_operator("olga", OPERATOR, tenant))
    request = ask(caller)
    url = reverse("admin:tools_app_idempotencyrecord_act", args=[request.record_id, "force_expire"])

    response = client.post(url, {"reason": "try"}, follow=True)

    assert any("only a finished record" in m for m in messages_of(response))
    assert not AuditEvent.objects.filter(action="record.force_expired").exists()


def test_an_approver_cannot_force_expire(caller, as_bob):
    call_tool(get_tool("create_ticket"), caller, {"idempotency_key": "t-1", "subject": "A", "body": "B"})
    record = IdempotencyRecord.objects.get()

    page = as_bob.get(reverse("admin:tools_app_idempotencyrecord_change", args=[record.pk]))

    assert page.status_code == 200 and b'id="action-force_expire"' not in page.content


def test_changing_a_threshold_is_audited(client, django_user_model, tenant):
    client.force_login(django_user_model.objects.create_superuser("root", "r@example.invalid", "pw"))

    response = client.post(reverse("admin:tools_app_approvalsettings_add"), {
        "tenant": tenant.pk, "request_ttl_minutes": 60, "payment_threshold": "100.00",
        "payment_second_threshold": "", "threshold_currency": "EUR", "escalate_after_minutes": 30})

    assert response.status_code == 302
    event = AuditEvent.objects.get(action="approval_settings.changed")
    assert event.actor == "user:root" and event.after["payment_threshold"] == "100.00"
    assert ApprovalSettings.objects.get().payment_threshold == 100


def test_a_settings_editor_is_offered_only_their_tenants_and_a_crafted_post_for_another_is_refused_and_audited(
        client, tenant, other_tenant):
    # given a staff member granted tenant acme and the permissions to add and change approval settings
    editor = make_operator("erin", OPERATOR, tenant)
    editor.user_permissions.add(*Permission.objects.filter(
        content_type__app_label="tools_app", codename__in=["add_approvalsettings", "change_approvalsettings"]))
    client.force_login(editor)

    form = client.get(reverse("admin:tools_app_approvalsettings_add"))
    # when they craft a POST that would switch globex's approvals off (an empty threshold)
    response = client.post(reverse("admin:tools_app_approvalsettings_add"), {
        "tenant": other_tenant.pk, "request_ttl_minutes": 60, "payment_threshold": "",
        "payment_second_threshold": "", "threshold_currency": "EUR"})

    # then: only acme is offered, the POST changes nothing, and the refusal is audited
    choices = [str(pk) for pk, _ in form.context["adminform"].form.fields["tenant"].choices if pk]
    assert choices == [str(tenant.pk)]
    assert response.status_code in (200, 403) and not ApprovalSettings.objects.filter(tenant=other_tenant).exists()
    assert not AuditEvent.objects.filter(action="approval_settings.changed").exists()


def test_a_settings_change_through_the_concept_function_is_refused_without_the_tenant_and_audited(
        tenant, other_tenant):
    editor = make_operator("erin", OPERATOR, tenant)
    editor.user_permissions.add(Permission.objects.get(codename="change_approvalsettings"))
    editor = type(editor).objects.get(pk=editor.pk)

    with pytest.raises(PermissionDenied, match="tenant you may not see"):
        approvals.save_settings(ApprovalSettings(tenant=other_tenant, payment_threshold=None), editor, before=None)

    assert not ApprovalSettings.objects.exists()
    assert AuditEvent.objects.filter(action="approval_settings.change_refused", actor="user:erin").count() == 1


def test_business_objects_are_shown_but_a_crafted_change_is_refused(client, caller, tenant):
    # given an order the tool created, and a staff member who even holds the model's change permission
    call_tool(get_tool("create_order"), caller, {"idempotency_key": "o-ro", "customer": "ACME", "currency": "EUR",
                                                 "items": [{"sku": "S", "quantity": 1, "unit_price": "2.50"}]})
    order = Order.objects.get()
    clerk = make_operator("carl", OPERATOR, tenant)
    clerk.user_permissions.add(Permission.objects.get(codename="change_order"))
    client.force_login(clerk)

    shown = client.get(reverse("admin:idemops_demo_order_change", args=[order.pk]))
    response = client.post(reverse("admin:idemops_demo_order_change", args=[order.pk]),
                           {"tenant": tenant.pk, "customer": "EVIL", "total": "0", "currency": "EUR"})

    assert shown.status_code == 200
    assert response.status_code == 403
    order.refresh_from_db()
    assert order.customer == "ACME"


# --- roles ---------------------------------------------------------------------------------------


def test_the_roles_exist_with_least_permissions(db):
    def perms(role):
        return set(Group.objects.get(name=role).permissions.values_list("codename", flat=True))

    # The platform's own, and what an installed app adds to the role (the demo: what a payment would touch).
    from django.apps import apps
    assert perms(APPROVER) == set(ROLE_PERMISSIONS[APPROVER]) | set(
        apps.get_app_config("idemops_demo").idemops_role_permissions[APPROVER])
    assert "view_order" in perms(APPROVER) and "view_document" not in perms(APPROVER)
    assert "decide_approvalrequest" in perms(APPROVER) and "decide_approvalrequest" not in perms(OPERATOR)
    assert "force_expire_idempotencyrecord" in perms(OPERATOR) and "force_expire_idempotencyrecord" not in perms(
        APPROVER)
    assert all(codename.startswith("view_") or codename == "use_auditor_api" for codename in perms(AUDITOR))
    assert not any(codename.startswith(("add_", "change_", "delete_")) for role in ROLE_PERMISSIONS
                   for codename in perms(role))


def test_an_auditor_reads_the_audit_log_but_not_the_queue(client, tenant):
    client.force_login(make_operator("ann", AUDITOR, tenant))

    assert client.get(reverse("admin:tools_app_auditevent_changelist")).status_code == 200
    assert client.get(QUEUE).status_code == 403


# --- the dashboard ---------------------------------------------------------------------------------


def test_the_dashboard_shows_rates_per_tool_and_waiting_approvals(caller, as_bob, tenant, other_tenant,
                                                                   django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        for outcome in [CallOutcome.EXECUTED, CallOutcome.REPLAYED, CallOutcome.REPLAYED, CallOutcome.CONFLICT]:
            counters.observe(counters.TOOL_CALL, 0.004, tool="create_order", tenant_id=tenant.pk, label=outcome)
        counters.observe(counters.TOOL_CALL, 0.001, tool="create_order", tenant_id=other_tenant.pk,
                         label=CallOutcome.CONFLICT)
    counters.flush()
    ask(caller)

    response = as_bob.get(reverse("admin:tools_app_dashboard_changelist"))
    day = as_bob.get(reverse("admin:tools_app_dashboard_changelist"), {"window": "day"})

    assert response.status_code == 200 and day.status_code == 200
    stats = {s.tool: s for s in response.context["snapshot"].tools}
    orders = stats["create_order"]
    assert (orders.writes, orders.count("replayed"), orders.count("conflict")) == (4, 2, 1)  # globex not counted
    assert orders.hit_rate == 0.5 and orders.conflict_rate == 0.25
    assert 0 < orders.replay_p50_ms <= 5.0  # estimated within its histogram bucket (up to 5 ms), as Prometheus does
    assert stats["publish_announcement"].approvals_waiting == 1
    page = response.content.decode()
    assert "50.0%" in page and "25.0%" in page and "<svg" in page and 'id="approvals-waiting">1<' in page
    assert "http://" not in page.split("<body")[1].replace("http://www.w3.org", "")  # no external assets


@pytest.mark.parametrize("role", [None, OPERATOR, APPROVER, AUDITOR])
def test_every_admin_page_renders_for_every_role(caller, client, django_user_model, tenant, role):
    # given: some of everything
    ask(caller)
    call_tool(get_tool("create_ticket"), caller, {"idempotency_key": "t-1", "subject": "A", "body": "B"})
    user = (make_operator("someone", role, tenant) if role else
            django_user_model.objects.create_superuser("root", "r@example.invalid", "pw"))
    client.force_login(user)

    for model in list(admin.site._registry):
        if model._meta.app_label != "tools_app":
            continue
        name = f"admin:{model._meta.app_label}_{model._meta.model_name}"
        listing = client.get(reverse(f"{name}_changelist"))
        # then: a page or a refusal, never an error
        assert listing.status_code in (200, 403), (role, model)
        if listing.status_code == 200 and "cl" in (listing.context or {}):
            for obj in listing.context["cl"].result_list[:1]:
                page = client.get(reverse(f"{name}_change", args=[obj.pk]))
                assert page.status_code == 200, (role, model)
