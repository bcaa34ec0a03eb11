"""Issue 42 §3 across real processes: an agent schedules a tool call over MCP; two job clusters run the
ticks (each worker's loop); each occurrence runs once under its own key, the overlap policy skips a
tick while the previous occurrence still runs, pause stops the ticks. Each run of the handler is a row
(tests/support/entity_tools.py), so runs are counted, and overlaps found, in SQL."""

from __future__ import annotations

import time

import pytest
from django.db import connection

from tests.support.entity_runs import RUNS_TABLE
from tests.support.mcp_client import call_sync, error_of
from tests.support.processes import WebServer, Worker
from tools_app.models import ScheduledRun
from tools_app.scheduling.models import RunStatus

pytestmark = pytest.mark.live

ENV = {"IDEMOPS_TOOL_MODULES": "tests.support.entity_tools", "IDEMOPS_SCHEDULE_TICK_SECONDS": "0.2",
       "IDEMOPS_Q_WORKERS": "2"}


@pytest.fixture
def farm(transactional_db):
    with connection.cursor() as cursor:
        cursor.execute(RUNS_TABLE)
        cursor.execute("TRUNCATE entity_runs")
    started = []
    try:
        started.append(WebServer("web-schedules", **ENV))
        started.append(Worker("jobs-schedules-a", **ENV))
        started.append(Worker("jobs-schedules-b", **ENV))
        yield started[0]
    finally:
        for service in reversed(started):
            service.stop(grace=3)


def _rows(sql: str, params=()) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def _wait(condition, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def _schedule(web, token, **arguments) -> int:
    answer = call_sync(web.mcp_url, token, "schedule_operation", {"idempotency_key": f"sched-{time.monotonic()}",
                                                                  **arguments})
    assert not answer.is_error, answer
    return answer.structured_content["schedule_id"]


def test_each_tick_runs_once_under_its_own_key_across_two_clusters_and_pause_stops_them(farm, token, other_token):
    schedule_id = _schedule(farm, token, tool="debit_account", cron="* * * * * */2",
                            arguments={"account": "acct-s", "hold_ms": 50})
    _wait(lambda: ScheduledRun.objects.filter(schedule_id=schedule_id, status=RunStatus.DONE).count() >= 4)

    paused = call_sync(farm.mcp_url, token, "pause_schedule", {"schedule_id": schedule_id,
                                                              "idempotency_key": f"pause-{schedule_id}"})
    assert paused.structured_content["paused"] is True
    time.sleep(1)  # a run already taken finishes
    done = ScheduledRun.objects.filter(schedule_id=schedule_id, status=RunStatus.DONE).count()
    time.sleep(4)  # two more ticks' time: none comes due while paused
    assert ScheduledRun.objects.filter(schedule_id=schedule_id).exclude(status=RunStatus.SKIPPED).count() == done

    # every occurrence ran the tool exactly once, under the key schedule-<id>-<tick>
    keys = [key for (key,) in _rows("SELECT key FROM entity_runs WHERE tool = 'debit_account'")]
    assert len(keys) == len(set(keys)) == done
    assert all(key.startswith(f"schedule-{schedule_id}-") for key in keys)
    assert set(keys) == set(ScheduledRun.objects.filter(schedule_id=schedule_id, status=RunStatus.DONE)
                            .values_list("key", flat=True))

    # the agent sees them; another tenant's agent does not find the schedule at all
    seen = call_sync(farm.mcp_url, token, "get_schedule", {"schedule_id": schedule_id}).structured_content
    assert seen["paused"] is True and len([r for r in seen["recent_runs"] if r["status"] == "done"]) >= 4
    for tool, arguments in (("get_schedule", {"schedule_id": schedule_id}),
                            ("resume_schedule", {"schedule_id": schedule_id, "idempotency_key": "crafted-resume"})):
        assert error_of(call_sync(farm.mcp_url, other_token, tool, arguments))["class"] == "not_found"


def test_overlap_skip_never_runs_two_occurrences_at_once(farm, token):
    # every second, each occurrence holding 2.5 s, on the tool without a concurrency key
    schedule_id = _schedule(farm, token, tool="debit_account_unkeyed", cron="* * * * * *", overlap="skip",
                            arguments={"account": "acct-o", "hold_ms": 2500})
    _wait(lambda: ScheduledRun.objects.filter(schedule_id=schedule_id, status=RunStatus.DONE).count() >= 2)
    call_sync(farm.mcp_url, token, "pause_schedule", {"schedule_id": schedule_id, "idempotency_key": "pause-o"})
    _wait(lambda: not ScheduledRun.objects.filter(schedule_id=schedule_id, status=RunStatus.RUNNING).exists(), 10)

    overlaps = _rows("SELECT count(*) FROM entity_runs a JOIN entity_runs b ON a.id < b.id "
                     "AND a.started_at < b.ended_at AND b.started_at < a.ended_at "
                     "WHERE a.tool = 'debit_account_unkeyed' AND b.tool = 'debit_account_unkeyed'")[0][0]
    assert overlaps == 0
    assert ScheduledRun.objects.filter(schedule_id=schedule_id, status=RunStatus.SKIPPED, outcome="overlap").exists()
