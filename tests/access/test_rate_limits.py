"""Per-tenant limits: calls per minute (the tenant's, each token's) and unfinished tasks per agent,
held in the database so they hold across processes, refused with `rate_limited` + `retry_after`
(never queued), and configured per tenant in the admin with an audit trail."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.urls import reverse
from django.utils import timezone

from tests.support.mcp_client import call_sync, error_of
from tests.support.operators import make_operator
from tests.support.processes import WebServer
from tests.support.race import race
from tools_app import access
from tools_app.access import CallLimits
from tools_app.access.roles import APPROVER, OPERATOR
from tools_app.core.errors import PermissionDenied, RateLimited
from tools_app.models import AuditEvent, IdempotencyRecord, RateBucket, Task, TenantLimits
from tools_app.toolkit.calls import Caller, call_tool
from tools_app.toolkit.registry import get_tool

DOCUMENT = {"text": "# Limits\n\nA task that waits its turn."}


def admitted(limits: CallLimits, times: int) -> list[bool]:
    answers = []
    for _ in range(times):
        try:
            access.admit_call(limits)
            answers.append(True)
        except RateLimited as limited:
            assert limited.error_class == "rate_limited" and limited.retry_after > 0
            answers.append(False)
    return answers


# --- calls per minute ----------------------------------------------------------------------------------


def test_a_token_over_its_calls_per_minute_is_refused_while_another_token_of_the_tenant_is_not(tenant):
    a = CallLimits(tenant_id=tenant.pk, token_id=1, token_per_minute=3)
    b = CallLimits(tenant_id=tenant.pk, token_id=2, token_per_minute=3)

    assert admitted(a, 5) == [True, True, True, False, False]
    assert admitted(b, 1) == [True]


def test_the_refusal_says_when_a_call_would_be_admitted_again(tenant):
    limits = CallLimits(tenant_id=tenant.pk, token_id=1, token_per_minute=6)  # one call every 10 s
    admitted(limits, 6)

    with pytest.raises(RateLimited) as refused:
        access.admit_call(limits)

    assert 9 < refused.value.retry_after <= 10
    assert "nothing was done" in refused.value.message


def test_a_call_refused_by_one_limit_takes_nothing_from_the_other(tenant):
    # given a tenant limit of 5 a minute and a token limit of 2 a minute
    a = CallLimits(tenant_id=tenant.pk, token_id=1, tenant_per_minute=5, token_per_minute=2)
    b = CallLimits(tenant_id=tenant.pk, token_id=2, tenant_per_minute=5, token_per_minute=10)

    # when token a makes 4 calls (2 over its own limit)
    assert admitted(a, 4) == [True, True, False, False]

    # then its refusals did not use the tenant's calls: b still has 3 of the 5
    assert admitted(b, 4) == [True, True, True, False]


def test_no_limit_costs_no_bucket(tenant):
    assert admitted(CallLimits(tenant_id=tenant.pk, token_id=1), 50) == [True] * 50
    assert not RateBucket.objects.exists()


def test_a_tenants_own_limits_replace_the_defaults_field_by_field(tenant, settings):
    from tools_app.conf import override_conf

    override_conf(settings, rate_limit_calls_per_minute=100, rate_limit_calls_per_minute_per_token=7)
    TenantLimits.objects.create(tenant=tenant, calls_per_minute=0, concurrent_tasks_per_agent=3)
    owner = get_user_model().objects.create_user("owner")
    _, raw = access.issue_token(tenant, "bot", owner=owner)

    limits = access.call_limits(access.authenticate_token(raw))

    assert (limits.tenant_per_minute, limits.token_per_minute) == (0, 7)
    assert access.limits.concurrent_tasks_limit(tenant.pk) == 3


@pytest.mark.live
def test_the_calls_per_minute_of_a_tenant_hold_across_two_web_processes(transactional_db, token):
    # given a tenant allowed one call a minute, and two web processes
    TenantLimits.objects.create(tenant=access.authenticate_token(token).tenant, calls_per_minute=1)
    first, second = WebServer("web-limits-1"), WebServer("web-limits-2")
    try:
        # when six calls alternate between them
        results = [call_sync(server.mcp_url, token, "whoami", {}) for server in (first, second) * 3]
    finally:
        first.stop()
        second.stop()

    # then one is admitted, and five are told to come back, with when
    refused = [error_of(r) for r in results if r.is_error]
    assert len(refused) == 5 and not results[0].is_error
    assert {e["class"] for e in refused} == {"rate_limited"}
    assert all(0 < e["retry_after"] <= 60 for e in refused)


# --- unfinished tasks per agent ------------------------------------------------------------------------------


def start(caller: Caller, key: str):
    return call_tool(get_tool("start_task"), caller, {"tool": "ingest_document", "arguments": DOCUMENT,
                                                      "idempotency_key": key})


@pytest.fixture
def two_tasks_each(tenant):
    TenantLimits.objects.create(tenant=tenant, concurrent_tasks_per_agent=2)


def test_an_agent_over_its_unfinished_tasks_is_refused_and_the_same_key_starts_once_a_place_frees(
        caller, tenant, two_tasks_each, fast):
    # given an agent with two unfinished tasks, its limit
    first, second = start(caller, "t-1"), start(caller, "t-2")
    assert first.error is None and second.error is None

    # when it starts a third
    third = start(caller, "t-3")

    # then it is refused, nothing started, and a retry before retry_after hears the same
    assert third.error.error_class == "rate_limited" and third.error.retry_after > 0
    assert Task.objects.count() == 2
    assert start(caller, "t-3").error.error_class == "rate_limited"
    # and another agent of the tenant is not held back by it
    assert start(Caller(tenant_id=tenant.pk, actor="agent:acme/other"), "o-1").error is None

    # when one of its tasks is cancelled and the retry comes after retry_after
    access_agent = access.Agent(tenant.pk, caller.actor)
    from tools_app import tasks

    tasks.cancel(Task.objects.get(pk=first.result["task_id"]), access_agent, reason="make room")
    IdempotencyRecord.objects.filter(key="t-3").update(retry_not_before=timezone.now())
    retried = start(caller, "t-3")

    # then the same key starts the task, once
    assert retried.error is None
    assert Task.objects.filter(record__key="t-3").count() == 1


@pytest.mark.django_db(transaction=True)
def test_two_starts_racing_for_the_last_place_start_one_task(tenant, fast):
    TenantLimits.objects.create(tenant=tenant, concurrent_tasks_per_agent=1)
    caller = Caller(tenant_id=tenant.pk, actor="agent:acme/racer")
    starts = race(*[lambda n=n: start(caller, f"race-{n}") for n in range(4)])

    assert starts.answered(4) and not starts.errors
    assert sorted(r.error.error_class if r.error else "started" for r in starts.results) == \
        ["rate_limited"] * 3 + ["started"]
    assert Task.objects.count() == 1


# --- the admin ---------------------------------------------------------------------------------------------


def test_an_operator_sets_a_tenants_limits_in_the_admin_and_the_change_is_audited(client, tenant):
    operator = make_operator("olga", OPERATOR, tenant)
    client.force_login(operator)

    response = client.post(reverse("admin:tools_app_tenantlimits_add"), {
        "tenant": tenant.pk, "calls_per_minute": "120", "calls_per_minute_per_token": "",
        "concurrent_tasks_per_agent": "4"})

    assert response.status_code == 302, response.content[:500]
    limits = TenantLimits.objects.get(tenant=tenant)
    assert (limits.calls_per_minute, limits.calls_per_minute_per_token, limits.concurrent_tasks_per_agent) == \
        (120, None, 4)
    event = AuditEvent.objects.get(action="limits.changed")
    assert event.actor == "user:olga" and event.tenant_id == tenant.pk
    assert event.after == {"calls_per_minute": 120, "calls_per_minute_per_token": None,
                           "concurrent_tasks_per_agent": 4}


def test_an_operator_changes_a_tenants_limits_later_and_back_to_the_default_with_an_empty_field(client, tenant):
    limits = TenantLimits.objects.create(tenant=tenant, calls_per_minute=60, concurrent_tasks_per_agent=4)
    client.force_login(make_operator("olga", OPERATOR, tenant))

    response = client.post(reverse("admin:tools_app_tenantlimits_change", args=[limits.pk]), {
        "calls_per_minute": "", "calls_per_minute_per_token": "30", "concurrent_tasks_per_agent": "4"})

    assert response.status_code == 302, response.content[:500]
    limits.refresh_from_db()
    assert (limits.calls_per_minute, limits.calls_per_minute_per_token) == (None, 30)
    event = AuditEvent.objects.get(action="limits.changed")
    assert (event.before["calls_per_minute"], event.after["calls_per_minute"]) == (60, None)


def test_a_person_without_the_permission_or_the_tenant_cannot_change_limits_even_with_a_crafted_request(
        client, tenant, other_tenant):
    limits = TenantLimits.objects.create(tenant=tenant, calls_per_minute=60)
    url = reverse("admin:tools_app_tenantlimits_change", args=[limits.pk])
    for user in (make_operator("bob", APPROVER, tenant), make_operator("eve", OPERATOR, other_tenant)):
        client.force_login(user)

        response = client.post(url, {"calls_per_minute": "0", "calls_per_minute_per_token": "",
                                     "concurrent_tasks_per_agent": ""})

        assert response.status_code in (403, 302) and TenantLimits.objects.get().calls_per_minute == 60
        if response.status_code == 302:  # the admin sent them away: the object is not theirs to see
            assert "login" in response["Location"] or reverse("admin:index") in response["Location"]
    assert not AuditEvent.objects.filter(action="limits.changed").exists()


def test_change_limits_called_directly_refuses_and_audits_a_person_without_the_permission(tenant):
    approver = make_operator("bob", APPROVER, tenant)

    with pytest.raises(PermissionDenied):
        access.change_limits(tenant, approver, {"calls_per_minute": 0})

    assert AuditEvent.objects.filter(action="limits.change_refused", actor="user:bob").count() == 1
    assert TenantLimits.objects.get(tenant=tenant).calls_per_minute is None
