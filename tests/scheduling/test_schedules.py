"""Issue 42 §3 on the real database, in this process: planning ticks (backfill with a limit, the key of
each occurrence, a tick found twice runs once) and who may schedule, pause and resume (crafted requests
to the console and to the concept functions, each refusal audited)."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.db import connection

from idemops_demo.models import Order
from tests.support.operators import VerifiedClient, make_operator
from tools_app import access, scheduling
from tools_app.access.roles import APPROVER, OPERATOR
from tools_app.core import clock
from tools_app.core.errors import InvalidInput, NotFound, PermissionDenied
from tools_app.models import AuditEvent, ScheduledOperation, ScheduledRun
from tools_app.scheduling import jobs as ticks
from tools_app.scheduling.models import RunStatus

ORDER = {"customer": "ACME", "currency": "EUR", "items": [{"sku": "A-1", "quantity": 1, "unit_price": "3.00"}]}


@pytest.fixture
def acme(transactional_db):
    return access.create_tenant("acme", "ACME")


@pytest.fixture
def olga(acme):
    return make_operator("olga", OPERATOR, acme)


def _agent(tenant) -> access.Agent:
    return access.Agent(tenant.pk, "agent:test")


def _missed_schedule(tenant, *, minutes_ago: int, backfill: int) -> ScheduledOperation:
    """An every-minute order whose scheduler was down for `minutes_ago` minutes."""
    row = scheduling.schedule(_agent(tenant), tenant.pk, "create_order", ORDER, cron="* * * * *", backfill=backfill)
    start = clock.read().replace(second=0, microsecond=0) - timedelta(minutes=minutes_ago)
    ScheduledOperation.objects.filter(pk=row.pk).update(next_tick_at=start)
    return row


def test_missed_ticks_run_up_to_the_backfill_limit_the_rest_are_recorded_as_missed(acme):
    row = _missed_schedule(acme, minutes_ago=9, backfill=2)

    ticks.plan()

    runs = list(ScheduledRun.objects.filter(schedule=row).order_by("tick_at"))
    # the ticks of the last 9 minutes and this one: the latest 3 (backfill 2 + the current) queued
    assert len(runs) in (10, 11)  # 11 when the minute turned between the two reads of the clock
    assert [run.status for run in runs[-3:]] == [RunStatus.QUEUED] * 3
    assert {(run.status, run.outcome) for run in runs[:-3]} == {(RunStatus.SKIPPED, "missed")}
    assert ScheduledOperation.objects.get(pk=row.pk).next_tick_at > clock.read()

    # when the queued ones run: one order each, under its own key (schedule + tick)
    ticks.run_due()
    assert Order.objects.count() == 3
    keys = [run.key for run in ScheduledRun.objects.filter(schedule=row, status=RunStatus.DONE)]
    assert len(keys) == 3 and all(key.startswith(f"schedule-{row.pk}-") for key in keys)
    assert {run.outcome for run in ScheduledRun.objects.filter(schedule=row, status=RunStatus.DONE)} == {"executed"}


def test_a_tick_that_fires_twice_runs_once(acme):
    row = _missed_schedule(acme, minutes_ago=1, backfill=0)
    ticks.plan()
    ticks.run_due()
    run = ScheduledRun.objects.get(schedule=row, status=RunStatus.DONE)
    assert Order.objects.count() == 1

    # given the same tick planned again (a second scheduler that missed the first's commit: the unique
    # (schedule, tick) holds it to one row) and its run taken again (a redelivery)
    ScheduledOperation.objects.filter(pk=row.pk).update(next_tick_at=run.tick_at)
    ticks.plan()
    assert ScheduledRun.objects.filter(schedule=row, tick_at=run.tick_at).count() == 1
    ScheduledRun.objects.filter(pk=run.pk).update(status=RunStatus.QUEUED)
    ticks.run_due()

    # then its key replays: still one order
    assert Order.objects.count() == 1
    assert ScheduledRun.objects.get(pk=run.pk).outcome == "replayed"


def test_a_paused_schedule_plans_nothing_and_resumes_from_its_next_tick(acme):
    row = _missed_schedule(acme, minutes_ago=5, backfill=3)
    scheduling.pause(row, _agent(acme), reason="month end")
    ticks.plan()
    assert not ScheduledRun.objects.filter(schedule=row).exists()

    resumed = scheduling.resume(ScheduledOperation.objects.get(pk=row.pk), _agent(acme))
    assert resumed.next_tick_at > clock.read()  # the ticks missed while paused do not run
    assert AuditEvent.objects.filter(action__in=["schedule.paused", "schedule.resumed"],
                                     object_id=str(row.pk)).count() == 2


def test_what_cannot_be_scheduled_is_refused_naming_why(acme):
    agent = _agent(acme)
    with pytest.raises(InvalidInput, match="cron"):
        scheduling.schedule(agent, acme.pk, "create_order", ORDER, cron="every monday")
    with pytest.raises(InvalidInput, match="either cron or run_at"):
        scheduling.schedule(agent, acme.pk, "create_order", ORDER)
    with pytest.raises(InvalidInput, match="idempotency_key"):
        scheduling.schedule(agent, acme.pk, "create_order", {**ORDER, "idempotency_key": "k"}, cron="* * * * *")
    with pytest.raises(InvalidInput, match="customer"):
        scheduling.schedule(agent, acme.pk, "create_order", {"currency": "EUR"}, cron="* * * * *")
    with pytest.raises(InvalidInput, match="cannot be scheduled"):
        scheduling.schedule(agent, acme.pk, "whoami", {}, cron="* * * * *")
    assert not ScheduledOperation.objects.exists()


def test_an_agent_cannot_reach_another_tenants_schedule(acme):
    globex = access.create_tenant("globex", "Globex")
    row = scheduling.schedule(_agent(acme), acme.pk, "create_order", ORDER, cron="* * * * *")
    with pytest.raises(NotFound):
        scheduling.get_for_tenant(globex.pk, row.pk)
    # a crafted call of the concept function with the other tenant's agent: refused and audited
    with pytest.raises(PermissionDenied):
        scheduling.pause(row, _agent(globex), reason="not mine")
    assert not ScheduledOperation.objects.get(pk=row.pk).paused
    assert AuditEvent.objects.filter(action="schedule.refused").count() == 1


def test_console_pause_needs_the_permission_and_the_tenant(acme, olga):
    globex = access.create_tenant("globex", "Globex")
    row = scheduling.schedule(_agent(acme), acme.pk, "create_order", ORDER, cron="* * * * *")
    url = f"/admin/tools_app/scheduledoperation/{row.pk}/act/pause/"

    # an approver (no manage_schedules) and an operator of another tenant POST what the button sends
    for person in (make_operator("bob", APPROVER, acme), make_operator("gina", OPERATOR, globex)):
        client = VerifiedClient()
        client.force_login(person)
        assert client.post(url, {"reason": "crafted"}).status_code in (403, 404)
    assert not ScheduledOperation.objects.get(pk=row.pk).paused

    # the operator of its tenant may; the list shows it
    client = VerifiedClient()
    client.force_login(olga)
    assert client.post(url, {"reason": "month end"}).status_code == 302
    assert ScheduledOperation.objects.get(pk=row.pk).paused
    listing = client.get("/admin/tools_app/scheduledoperation/")
    assert listing.status_code == 200 and "create_order" in listing.content.decode()


def test_console_schedules_through_the_concept_function_and_refuses_without_the_permission(acme, olga):
    data = {"tenant": acme.pk, "tool": "create_order", "arguments": '{"customer": "ACME", "currency": "EUR", '
            '"items": [{"sku": "A-1", "quantity": 1, "unit_price": "3.00"}]}', "cron": "0 6 * * 1-5",
            "run_at_0": "", "run_at_1": "", "overlap": "skip", "backfill": "0"}
    bob = VerifiedClient()
    bob.force_login(make_operator("bob", APPROVER, acme))
    assert bob.post("/admin/tools_app/scheduledoperation/add/", data).status_code == 403
    assert not ScheduledOperation.objects.exists()

    client = VerifiedClient()
    client.force_login(olga)
    bad = client.post("/admin/tools_app/scheduledoperation/add/", {**data, "cron": "whenever"})
    assert bad.status_code == 200 and "is not a cron rule" in bad.content.decode()
    assert client.post("/admin/tools_app/scheduledoperation/add/", data).status_code == 302
    row = ScheduledOperation.objects.get()
    assert row.created_by == "user:olga" and row.next_tick_at is not None
    assert AuditEvent.objects.filter(action="schedule.created", actor="user:olga").count() == 1


def test_the_key_names_the_schedule_and_the_tick(acme):
    row = scheduling.schedule(_agent(acme), acme.pk, "create_order", ORDER, cron="* * * * * */5")
    tick = row.next_tick_at
    assert scheduling.operations.key_of(row, tick) == f"schedule-{row.pk}-{tick:%Y%m%dT%H%M%S}.{tick:%f}Z"
    with connection.cursor() as cursor:  # the key is one the engine accepts
        cursor.execute("SELECT %s ~ '^[A-Za-z0-9._:-]+$'", [scheduling.operations.key_of(row, tick)])
        assert cursor.fetchone()[0]


def test_an_occurrence_held_back_by_a_pause_runs_once_the_tool_is_resumed(acme, settings):
    from django.contrib.auth import get_user_model

    from tests.support.operators import verified
    from tools_app import incidents
    from tools_app.conf import override_conf

    # given a paused create_order (every process hears of it at once here) and an occurrence coming due
    override_conf(settings, incident_state_seconds=0.05)
    root = verified(get_user_model().objects.create_superuser("root", "root@example.invalid", "pw"))
    incidents.pause(incidents.PauseScope.TOOL, "create_order", root, reason="month-end freeze")
    time.sleep(0.1)  # older than IDEMOPS_INCIDENT_STATE_SECONDS: this process reads the pause
    row = _missed_schedule(acme, minutes_ago=1, backfill=0)
    ticks.plan()

    # when it runs: held back (transient), nothing made, and the occurrence stays to be asked again
    ticks.run_due()
    run = ScheduledRun.objects.get(schedule=row, status=RunStatus.RUNNING)
    assert run.error_class == "transient" and Order.objects.count() == 0

    # when the tool is resumed and the run is due again (LOST_AFTER past its start)
    incidents.resume(incidents.PauseScope.TOOL, "create_order", root, reason="freeze over")
    time.sleep(0.1)
    ScheduledRun.objects.filter(pk=run.pk).update(started_at=clock.read() - ticks.LOST_AFTER - timedelta(seconds=1))
    ticks.run_due()

    # then it ran once, under its key, and is done
    run.refresh_from_db()
    assert (run.status, run.outcome, run.error_class) == (RunStatus.DONE, "executed", "")
    assert Order.objects.count() == 1


@pytest.mark.parametrize(("overlap", "left"), [("queue", RunStatus.QUEUED), ("skip", RunStatus.SKIPPED)])
def test_ticks_while_an_occurrence_runs_wait_their_turn_under_queue_and_are_dropped_under_skip(acme, overlap, left):
    # given three due occurrences of a schedule, the first of them still running (its call under way)
    row = scheduling.schedule(_agent(acme), acme.pk, "create_order", ORDER, cron="* * * * *", backfill=2,
                              overlap=overlap)
    start = clock.read().replace(second=0, microsecond=0) - timedelta(minutes=2)
    ScheduledOperation.objects.filter(pk=row.pk).update(next_tick_at=start)
    ticks.plan()
    first, *others = ScheduledRun.objects.filter(schedule=row).order_by("tick_at")
    ScheduledRun.objects.filter(pk=first.pk).update(status=RunStatus.RUNNING, started_at=clock.read())

    # when the loop runs
    ticks.run_due()

    # then nothing else ran meanwhile: under queue the others wait their turn, under skip they are dropped
    assert Order.objects.count() == 0
    assert {run.status for run in ScheduledRun.objects.filter(pk__in=[run.pk for run in others])} == {left}

    # and under queue, once the first is done, they run one after another, each under its own key
    if overlap == "queue":
        ScheduledRun.objects.filter(pk=first.pk).update(status=RunStatus.DONE)
        ticks.run_due()
        assert Order.objects.count() == len(others)
        assert set(ScheduledRun.objects.filter(schedule=row).values_list("status", flat=True)) == {RunStatus.DONE}
