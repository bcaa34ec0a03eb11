"""No operator action can be done without its permission, or on another tenant's object.

The table is built from the registered admins: for every operator action and
every role that lacks the action's permission (and for a role that has it,
granted another tenant only), a crafted GET and POST to the object's action
URL and a crafted POST of the list action are refused with 403, each leaves
exactly one refusal in the audit log, and nothing else changes: the row
stays as it was, and for a key the next call is still a replay. The same holds for a person who may
do the action but whose session entered no second-factor code.
"""

from datetime import timedelta

import httpx2
import pytest
from django.contrib import admin
from django.core.management import CommandError, call_command
from django.urls import reverse
from django.utils import timezone

from idemops_demo.models import Order
from tests.support.issued_ids import call_labelled
from tests.support.mcp_client import call_sync
from tests.support.operators import PASSWORD, current_code, login_for_the_web_server, make_operator
from tools_app import access, engine, outbox, reconciliation, scheduling, tasks
from tools_app.access.roles import APPROVER, AUDITOR, OPERATOR, ROLE_PERMISSIONS
from tools_app.admin.operator_actions import OperatorActionsAdmin
from tools_app.conf import override_conf
from tools_app.core.errors import PermissionDenied, Transient, internal_error
from tools_app.models import AuditEvent, IdempotencyRecord, OutboxEvent, RecordStatus, Task, Tenant
from tools_app.reconciliation.models import UnknownOutcomeQueue
from tools_app.toolkit.calls import Caller, call_tool, validate_arguments, write_operation
from tools_app.toolkit.registry import get_tool

pytestmark = pytest.mark.live  # the payment scenes talk to the test gateway process

ORDER = {"customer": "ACME", "currency": "EUR", "items": [{"sku": "A-1", "quantity": 2, "unit_price": "9.50"}]}
PAYMENT = {"amount": "42.50", "currency": "EUR", "payee": "ACME Supplies", "reference": "INV-7"}
NOTE = {"title": "Maintenance", "body": "Down at 2am", "audience": "staff"}
TEXT = "# Notes\n\nThe crane schedule moved. Pallets wait at dock four."


def registered_operator_actions():
    """(admin, action) for every operator action of every registered admin."""
    return [(model_admin, action) for model_admin in admin.site._registry.values()
            if isinstance(model_admin, OperatorActionsAdmin) for action in model_admin.operator_actions]


def roles_with(permission: str) -> list[str]:
    codename = permission.removeprefix("tools_app.")
    return [role for role, codenames in ROLE_PERMISSIONS.items() if codename in codenames]


def refusal_cases():
    """(admin, action, role, on another tenant): every role lacking the permission, and a holder of another tenant."""
    cases = []
    for model_admin, action in registered_operator_actions():
        name = f"{model_admin.opts.model_name}-{action.name}"
        holders = roles_with(action.permit.permission)
        for role in ROLE_PERMISSIONS:
            if role not in holders:
                cases.append(pytest.param(model_admin, action, role, False, id=f"{name}-{role}"))
        holder = holders[0] if holders else None  # None: nobody may do it, which the test reports
        cases.append(pytest.param(model_admin, action, holder, True, id=f"{name}-{holder}-of-another-tenant"))
    return cases


def action_cases():
    return [pytest.param(model_admin, action, id=f"{model_admin.opts.model_name}-{action.name}")
            for model_admin, action in registered_operator_actions()]


# --- scenes: an object each action would change, made the way the system makes it ---------------------


class Scene:
    """An object an action can be done on, and what "nothing changed" means for it beyond its row."""

    def __init__(self, obj, *, values=None, next_call=None, made=None):
        self.obj = obj
        self.values = values or {}  # form values the action needs (e.g. the downstream reference)
        self.next_call = next_call  # () -> None: asserts the key still answers as before
        self.made = made  # () -> what an action creates from the object rather than changing it (a fork)

    def row(self) -> dict:
        row = type(self.obj)._default_manager.filter(pk=self.obj.pk).values().get()
        return row if self.made is None else {**row, "made": self.made()}


def an_order(request, caller) -> Scene:
    """A create_order within its retention: force_expire would end it."""
    first = call_tool(get_tool("create_order"), caller, {**ORDER, "idempotency_key": "o-1"})
    orders = Order.objects.count()

    def still_a_replay():
        again = call_tool(get_tool("create_order"), caller, {**ORDER, "idempotency_key": "o-1"})
        assert again.replayed and again.result["order_id"] == first.result["order_id"]
        assert Order.objects.count() == orders

    return Scene(IdempotencyRecord.objects.get(pk=first.record.pk), next_call=still_a_replay)


def a_held_payment(request, caller) -> Scene:
    """A request_payment past its retention: its key is held (answers `expired`) until an operator releases it."""
    gateway = request.getfixturevalue("gateway")
    request.getfixturevalue("downstreams")
    first = call_labelled(caller, "request_payment", {**PAYMENT, "idempotency_key": "p-1"})
    assert first.error is None, first.error
    IdempotencyRecord.objects.filter(pk=first.record.pk).update(expires_at=timezone.now() - timedelta(minutes=1))

    def still_held():
        again = call_labelled(caller, "request_payment", {**PAYMENT, "idempotency_key": "p-1"})
        assert again.error is not None and again.error.error_class == "expired"
        assert len(gateway.payments()) == 1

    return Scene(IdempotencyRecord.objects.get(pk=first.record.pk), next_call=still_held)


def record_scene(request, caller, action) -> Scene:
    return a_held_payment(request, caller) if action.name == "release_held_key" else an_order(request, caller)


def an_unknown_payment(request, caller, model) -> Scene:
    """The executor sent the payment to the gateway, then died before recording it: UNKNOWN after its lease."""
    gateway = request.getfixturevalue("gateway")
    request.getfixturevalue("downstreams")
    spec = get_tool("request_payment")
    operation, _ = write_operation(spec, caller, validate_arguments(spec, {**PAYMENT, "idempotency_key": "p-2"}))
    record, claimed = engine.claim(operation)
    assert claimed
    sent = httpx2.post(f"{gateway.url}/payments", json=PAYMENT, headers={"Idempotency-Key": record.downstream_key})
    assert sent.status_code in (200, 201), sent.text
    IdempotencyRecord.objects.filter(pk=record.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert [r.pk for r in engine.expire_leases()] == [record.pk]
    return Scene(model.objects.get(pk=record.pk), values={"downstream_reference": sent.json()["payment_id"]})


def a_dead_letter(request, caller, model, settings) -> Scene:
    """A notification whose delivery failed its last allowed attempt."""
    override_conf(settings, outbox_max_attempts=1)
    sent = call_tool(get_tool("send_notification"), caller, {
        "channel": "email", "recipient": "ops@example.com", "subject": "Disk full", "body": "Please look.",
        "idempotency_key": "n-1"})
    event = OutboxEvent.objects.get(pk=sent.result["notification_id"])
    assert outbox.record_failed_attempt(event, "SMTPRecipientsRefused")
    return Scene(model.objects.get(pk=event.pk))


def a_retrying_task(request, caller, model) -> Scene:
    """A long task whose first attempt failed transiently: it waits for its next attempt."""
    started = call_tool(get_tool("start_task"), caller, {"tool": "ingest_document", "arguments": {"text": TEXT},
                                                         "idempotency_key": "t-1"})
    assert started.error is None, started.error
    task = tasks.take(started.result["task_id"], "worker-a")
    assert tasks.retry_later(task, "worker-a", Transient("the document server answered 503"), 300,
                             waited_by_worker=False)
    # Forking it (from its first step: it has no checkpoints yet) leaves it as it is and makes a new task.
    return Scene(model.objects.get(pk=task.pk), values={"from_step": "receive"},
                 made=lambda: list(Task.objects.filter(forked_from=task.pk).values_list("pk", flat=True)))


def a_task_failed_by_a_bug(request, caller, model) -> Scene:
    """A long task whose step raised a KeyError: failed with internal_error, its cause not yet marked fixed."""
    started = call_tool(get_tool("start_task"), caller, {"tool": "ingest_document", "arguments": {"text": TEXT},
                                                         "idempotency_key": "t-2"})
    assert started.error is None, started.error
    task = tasks.take(started.result["task_id"], "worker-a")
    assert tasks.fail(task, "worker-a", internal_error(KeyError("chunks"), task.pk))
    return Scene(model.objects.get(pk=task.pk))


def a_pending_approval(request, caller, model) -> Scene:
    """An announcement waiting for an approver."""
    result = call_labelled(caller, "publish_announcement", {**NOTE, "idempotency_key": "a-1"})
    return Scene(model.objects.get(pk=result.error.as_dict()["approval"]["request_id"]))


def a_schedule(request, caller, model, action) -> Scene:
    """An hourly order its agent scheduled: running for `pause`, paused for `resume`."""
    agent = access.Agent(caller.tenant_id, caller.actor)
    row = scheduling.schedule(agent, caller.tenant_id, "create_order", ORDER, cron="0 * * * *")
    if action.name == "resume":
        scheduling.pause(row, agent, reason="month end")
    return Scene(model.objects.get(pk=row.pk))


def make_scene(request, model_admin, action, caller) -> Scene:
    model = model_admin.model
    match model._meta.model_name:
        case "idempotencyrecord":
            return record_scene(request, caller, action)
        case "unknownoutcomequeue":
            return an_unknown_payment(request, caller, model)
        case "deadletter":
            return a_dead_letter(request, caller, model, request.getfixturevalue("settings"))
        case "task" | "taskneedingattention" if action.name == "mark_cause_fixed":
            return a_task_failed_by_a_bug(request, caller, model)
        case "task" | "taskneedingattention":
            return a_retrying_task(request, caller, model)
        case "approvalqueue":
            return a_pending_approval(request, caller, model)
        case "scheduledoperation":
            return a_schedule(request, caller, model, action)
    raise AssertionError(f"no scene for {model._meta.label}: add one so its actions are tested here")


def form(action, scene, reason="crafted by the test") -> dict:
    return {"reason": reason, **{name: scene.values.get(name, "looked at the gateway: nothing")
                                 for name in action.extra_fields}}


def object_url(model_admin, action, obj) -> str:
    return reverse(f"admin:{model_admin.opts.app_label}_{model_admin.opts.model_name}_act", args=[obj.pk, action.name])


def list_url(model_admin) -> str:
    return reverse(f"admin:{model_admin.opts.app_label}_{model_admin.opts.model_name}_changelist")


# --- the table ----------------------------------------------------------------------------------------


def test_the_table_covers_every_operator_action():
    covered = {(m.opts.model_name, a.name) for m, a in registered_operator_actions()}

    assert covered >= {
        ("idempotencyrecord", "force_expire"), ("idempotencyrecord", "release_held_key"),
        ("unknownoutcomequeue", "reconcile"), ("unknownoutcomequeue", "resolve_succeeded"),
        ("unknownoutcomequeue", "resolve_failed"),
        ("deadletter", "redrive"), ("approvalqueue", "approve"), ("approvalqueue", "reject"),
        *((queue, name) for queue in ("task", "taskneedingattention")
          for name in ("cancel", "resume", "pause", "fork", "mark_cause_fixed")),
    }


@pytest.mark.parametrize("how", ["GET the object's action URL", "POST the object's action URL",
                                 "POST the list action"])
@pytest.mark.parametrize(("model_admin", "action", "role", "elsewhere"), refusal_cases())
def test_a_user_without_the_permission_or_the_tenant_is_refused_audited_and_changes_nothing(
        request, client, caller, tenant, other_tenant, model_admin, action, role, elsewhere, how):
    # given: an object the action would change, and a user who may not do it on it
    assert role is not None, f"no role has {action.permit.permission}: add it to tools_app.roles"
    scene = make_scene(request, model_admin, action, caller)
    client.force_login(make_operator("mallory", role, other_tenant if elsewhere else tenant))
    row, events = scene.row(), AuditEvent.objects.count()

    # when: the user crafts the request the hidden button would have sent
    if how == "GET the object's action URL":
        response = client.get(object_url(model_admin, action, scene.obj))
    elif how == "POST the object's action URL":
        response = client.post(object_url(model_admin, action, scene.obj), form(action, scene))
    else:
        response = client.post(list_url(model_admin), {
            "action": action.name, "index": "0", "_selected_action": [scene.obj.pk], "confirm": "yes",
            **form(action, scene)})

    # then: refused, one refusal audited (and nothing else), nothing changed
    assert response.status_code == 403
    refusals = AuditEvent.objects.filter(action=action.permit.refused_event, object_id=str(scene.obj.pk))
    assert refusals.count() == 1 and AuditEvent.objects.count() == events + 1
    refusal = refusals.get()
    assert refusal.actor == "user:mallory" and refusal.after == {"attempted": action.permit.attempted}
    assert ("tenant you may not see" if elsewhere else "missing permission") in refusal.reason
    assert scene.row() == row
    if scene.next_call is not None:
        scene.next_call()


@pytest.mark.parametrize("how", ["POST the object's action URL", "POST the list action"])
@pytest.mark.parametrize(("model_admin", "action"), action_cases())
def test_a_session_without_a_second_factor_is_refused_audited_and_changes_nothing(
        request, client, caller, tenant, model_admin, action, how):
    # given: the person may do the action on this tenant, but their session entered no authenticator code
    scene = make_scene(request, model_admin, action, caller)
    client.force_login(make_operator("olga", roles_with(action.permit.permission)[0], tenant), second_factor=False)
    row, events = scene.row(), AuditEvent.objects.count()

    # when: they craft the POST the button would send
    if how == "POST the object's action URL":
        response = client.post(object_url(model_admin, action, scene.obj), form(action, scene))
    else:
        response = client.post(list_url(model_admin), {
            "action": action.name, "index": "0", "_selected_action": [scene.obj.pk], "confirm": "yes",
            **form(action, scene)})

    # then: refused, audited once, nothing changed
    assert response.status_code == 403
    refusal = AuditEvent.objects.get(action=action.permit.refused_event, object_id=str(scene.obj.pk))
    assert refusal.actor == "user:olga" and "second factor required" in refusal.reason
    assert AuditEvent.objects.count() == events + 1
    assert scene.row() == row
    if scene.next_call is not None:
        scene.next_call()


@pytest.mark.parametrize(("model_admin", "action"), action_cases())
def test_a_user_with_the_permission_on_the_tenant_does_the_action(request, client, caller, tenant, model_admin,
                                                                  action):
    # given: the same scenes as above (so "nothing changed" there means something)
    scene = make_scene(request, model_admin, action, caller)
    client.force_login(make_operator("olga", roles_with(action.permit.permission)[0], tenant))
    row = scene.row()

    # when
    response = client.post(object_url(model_admin, action, scene.obj), form(action, scene), follow=True)

    # then
    assert response.status_code == 200
    assert not [m for m in response.context["messages"] if m.level_tag == "error"]
    assert scene.row() != row
    assert not AuditEvent.objects.filter(action=action.permit.refused_event).exists()


def test_a_crafted_list_action_on_several_objects_is_refused_when_one_is_another_tenants(
        client, caller, tenant, other_tenant):
    theirs = call_tool(get_tool("create_order"), Caller(other_tenant.pk, "agent:globex/x"),
                       {**ORDER, "idempotency_key": "o-1"})
    mine = an_order(None, caller)
    client.force_login(make_operator("olga", OPERATOR, tenant))
    url = list_url(admin.site._registry[IdempotencyRecord])

    response = client.post(url, {"action": "force_expire", "index": "0", "confirm": "yes", "reason": "both",
                                 "_selected_action": [mine.obj.pk, theirs.record.pk]})

    assert response.status_code == 403
    refusal = AuditEvent.objects.get(action="record.force_expire_refused")
    assert refusal.object_id == str(theirs.record.pk) and refusal.tenant_id == other_tenant.pk
    assert not AuditEvent.objects.filter(action="record.force_expired").exists()
    mine.next_call()


@pytest.mark.parametrize("selection", [
    {"select_across": "1", "_selected_action": []},  # "select all", no row named
    {"_selected_action": []},  # nothing selected at all
])
def test_a_crafted_list_action_that_names_no_row_is_refused_and_audited_too(client, caller, tenant, selection):
    scene = an_order(None, caller)
    client.force_login(make_operator("bob", APPROVER, tenant))
    url = list_url(admin.site._registry[IdempotencyRecord])

    response = client.post(url, {"action": "force_expire", "index": "0", "confirm": "yes", "reason": "all",
                                 **selection})

    assert response.status_code == 403
    refusal = AuditEvent.objects.get(action="record.force_expire_refused")
    assert (refusal.actor, refusal.object_type, refusal.object_id) == ("user:bob", "idempotencyrecord", "*")
    assert not AuditEvent.objects.filter(action="record.force_expired").exists()
    scene.next_call()


# --- the concept functions refuse whoever calls them -----------------------------------------------------


def test_force_expire_called_directly_refuses_an_approver_and_audits_it(caller, tenant):
    scene = an_order(None, caller)
    bob = make_operator("bob", APPROVER, tenant)

    with pytest.raises(PermissionDenied, match="missing permission"):
        reconciliation.force_expire(scene.obj, bob, reason="the agent asked")

    assert AuditEvent.objects.filter(action="record.force_expire_refused", actor="user:bob").count() == 1
    scene.next_call()


def test_the_reconcile_command_needs_an_operator_who_may_reconcile(request, caller, tenant):
    scene = an_unknown_payment(request, caller, UnknownOutcomeQueue)
    make_operator("ann", AUDITOR, tenant)
    make_operator("olga", OPERATOR, tenant)

    with pytest.raises(CommandError, match="--user"):
        call_command("reconcile", record=scene.obj.pk)
    with pytest.raises(CommandError, match="missing permission"):
        call_command("reconcile", record=scene.obj.pk, user="ann")
    assert IdempotencyRecord.objects.get(pk=scene.obj.pk).status == RecordStatus.UNKNOWN
    assert AuditEvent.objects.filter(action="record.reconcile_refused", actor="user:ann").count() == 1

    call_command("reconcile", record=scene.obj.pk, user="olga")
    record = IdempotencyRecord.objects.get(pk=scene.obj.pk)
    assert record.status == RecordStatus.SUCCEEDED
    assert AuditEvent.objects.get(action="record.reconciled", object_id=str(record.pk)).actor == "user:olga"


# --- end to end: the scenario of the report, over HTTP against uvicorn --------------------------------


def admin_session(web_server, user) -> httpx2.Client:
    """A logged-in admin session over HTTP, as a browser would have it (cookie and CSRF token)."""
    login_for_the_web_server(user)
    http = httpx2.Client(base_url=web_server.base_url, timeout=30)
    http.get("/admin/login/")
    response = http.post("/admin/login/?next=/admin/", data={
        "username": user.get_username(), "password": PASSWORD, "otp_token": current_code(user),
        "csrfmiddlewaretoken": http.cookies["csrftoken"], "next": "/admin/"})
    assert response.status_code == 302 and response.headers["location"] == "/admin/", response.text[:500]
    return http


def test_over_http_an_approver_cannot_force_expire_a_key_so_the_next_call_is_a_replay_not_a_second_order(
        web_server, token):
    # given: an order the agent made over MCP, and an approver and an operator of its tenant, logged in
    tenant = Tenant.objects.get(slug="acme")
    first = call_sync(web_server.mcp_url, token, "create_order", {**ORDER, "idempotency_key": "o-http"})
    record = IdempotencyRecord.objects.get(key="o-http")
    url = f"/admin/tools_app/idempotencyrecord/{record.pk}/act/force_expire/"
    bob = admin_session(web_server, make_operator("bob", APPROVER, tenant))
    olga = admin_session(web_server, make_operator("olga", OPERATOR, tenant))

    # when: the approver POSTs the force-expire the button would have sent
    refused = bob.post(url, data={"reason": "the agent asked", "csrfmiddlewaretoken": bob.cookies["csrftoken"]})
    again = call_sync(web_server.mcp_url, token, "create_order", {**ORDER, "idempotency_key": "o-http"})

    # then: 403, audited, and the key still replays the one order
    assert refused.status_code == 403
    assert AuditEvent.objects.filter(action="record.force_expire_refused", actor="user:bob").count() == 1
    assert again.structured_content["order_id"] == first.structured_content["order_id"]
    assert again.structured_content["idempotency"]["replayed"] is True
    assert Order.objects.count() == 1

    # and: the operator may, and then the key runs again as the tool's expiry policy says (a second order)
    done = olga.post(url, data={"reason": "customer asked to re-run", "csrfmiddlewaretoken": olga.cookies["csrftoken"]})
    rerun = call_sync(web_server.mcp_url, token, "create_order", {**ORDER, "idempotency_key": "o-http"})
    assert done.status_code == 302
    assert rerun.structured_content["idempotency"]["replayed"] is False and Order.objects.count() == 2
