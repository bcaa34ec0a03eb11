"""The seed metrics over time (tools_app.metrics.trends) and the dashboard's charts of them."""

from bisect import bisect_left
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from tests.support.api_support import make_event, make_record
from tests.support.operators import make_operator
from tools_app import engine
from tools_app.access.roles import OPERATOR
from tools_app.core import counters, logs
from tools_app.metrics import trends
from tools_app.models import IdempotencyRecord, MetricMinute, RecordStatus
from tools_app.toolkit import downstream

NOW = timezone.now().replace(second=30, microsecond=0)


def calls(tenant, minutes_ago: int, tool="create_order", **outcomes: int | list[float]):
    """The per-minute rows of tool calls `minutes_ago` before NOW, as the processes write them
    (tools_app.core.counters): outcome=count, or outcome=[latencies in ms]."""
    for outcome, spec in outcomes.items():
        latencies = [ms / 1000 for ms in spec] if isinstance(spec, list) else [0.001] * spec
        buckets = [0] * (len(counters.TOOL_CALL.buckets) + 1)
        for seconds in latencies:
            buckets[bisect_left(counters.TOOL_CALL.buckets, seconds)] += 1
        MetricMinute.objects.create(minute=minute(minutes_ago), tenant_id=tenant.pk, tool=tool, metric="tool_call",
                                    label=outcome, count=len(latencies), sum=sum(latencies), buckets=buckets)


def counted(tenant, minutes_ago: int, metric: counters.Metric, n: int = 1, tool="request_payment"):
    MetricMinute.objects.create(minute=minute(minutes_ago), tenant_id=tenant.pk, tool=tool, metric=metric.name,
                                count=n)


def minute(minutes_ago: int):
    return (NOW - timedelta(minutes=minutes_ago)).replace(second=0)


def point(trend, minutes_ago: int) -> trends.Point:
    """The hour window's point (one per minute) holding NOW - minutes_ago."""
    return trend.points[-1 - minutes_ago]


@pytest.fixture
def olga(tenant):
    return make_operator("olga", OPERATOR, tenant)


def test_hit_and_conflict_rates_and_replay_latency_per_minute(tenant, olga):
    calls(tenant, 5, executed=2, replayed=[2.0, 4.0, 6.0, 8.0, 10.0], conflict=3)
    calls(tenant, 1, executed=1)
    calls(tenant, 1, tool="whoami", executed=7)  # a read tool

    trend = trends.trend(olga, "hour", now=NOW)

    five, one, quiet = point(trend, 5), point(trend, 1), point(trend, 3)
    assert len(trend.points) == 60
    assert (five.writes, five.hit_rate_percent, five.conflict_rate_percent) == (10, 50.0, 30.0)
    # from the replayed calls' histogram (buckets of 5 and 10 ms here), interpolated as Prometheus does
    assert 5.0 < five.replay_p50_ms < five.replay_p95_ms <= 10.0
    assert (one.writes, one.hit_rate_percent, one.replay_p50_ms) == (1, 0.0, None)  # reads are not writes
    assert (quiet.writes, quiet.hit_rate_percent) == (0, None)


def test_processing_timeouts_and_unknown_records_over_time(tenant, olga):
    # given: a lease expired 20 minutes ago (UNKNOWN since), another 10 minutes ago, reconciled 4 minutes ago
    counted(tenant, 20, counters.PROCESSING_TIMEOUT)
    counted(tenant, 10, counters.PROCESSING_TIMEOUT)
    stuck = make_record(tenant, tool="request_payment", status=RecordStatus.UNKNOWN)
    settled = make_record(tenant, tool="request_payment", status=RecordStatus.SUCCEEDED)
    for record, minutes in ((stuck, 20), (settled, 10)):
        make_event(tenant, action="record.unknown", reason="lease expired", object_id=str(record.pk),
                   created_at=NOW - timedelta(minutes=minutes))
    make_event(tenant, action="record.reconciled", object_id=str(settled.pk), created_at=NOW - timedelta(minutes=4))

    trend = trends.trend(olga, "hour", now=NOW)

    assert [point(trend, m).processing_timeouts for m in (20, 10, 4)] == [1, 1, 0]
    assert [point(trend, m).unknown for m in (30, 20, 15, 10, 5, 4, 0)] == [0, 1, 1, 2, 2, 1, 1]


def test_the_engine_writes_what_the_trends_count(tenant, olga, django_capture_on_commit_callbacks):
    record = make_record(tenant, tool="request_payment", status=RecordStatus.PROCESSING)
    IdempotencyRecord.objects.filter(pk=record.pk).update(lease_owner="w1",
                                                          lease_expires_at=timezone.now() - timedelta(seconds=1))

    with django_capture_on_commit_callbacks(execute=True):  # counts are taken once the change commits
        assert engine.expire_lease(IdempotencyRecord.objects.get(pk=record.pk))
    counters.flush()  # each process writes its counts about once a second; now, here

    last = trends.trend(olga, "hour").points[-1]
    assert (last.processing_timeouts, last.unknown) == (1, 1)


def test_downstream_duplicates_per_minute(tenant, olga):
    counted(tenant, 7, counters.DOWNSTREAM_DUPLICATE, n=2)

    trend = trends.trend(olga, "hour", now=NOW)

    assert [point(trend, m).downstream_duplicates for m in (8, 7, 6)] == [0, 2, 0]


def test_a_payment_the_real_gateway_replays_is_counted_as_a_downstream_duplicate(
        tenant, olga, gateway, django_capture_on_commit_callbacks):
    # given a payment sent to the gateway process, then sent again with its key (a retry after a lost answer)
    payment = {"amount": "12.50", "currency": "EUR", "payee": "ACME", "reference": "inv-7"}
    with logs.bound(tool="request_payment", tenant_id=tenant.pk), \
            django_capture_on_commit_callbacks(execute=True):  # counts are taken once the change commits
        for _ in range(2):
            downstream.request("POST", f"{gateway.url}/payments", timeout=5, json=payment,
                               headers={"Idempotency-Key": "pay-dup-1"})
    counters.flush()

    # then the gateway paid once, and the hour's trend counts the one replay it answered
    assert len(gateway.payments()) == 1
    assert sum(p.downstream_duplicates for p in trends.trend(olga, "hour").points) == 1


def test_windows_of_a_day_and_a_week_bucket_the_same_calls(tenant, olga):
    calls(tenant, 90, executed=1, replayed=3)

    day, week = trends.trend(olga, "day", now=NOW), trends.trend(olga, "week", now=NOW)

    assert (len(day.points), len(week.points)) == (96, 84)
    assert sum(p.writes for p in day.points) == sum(p.writes for p in week.points) == 4
    assert max(p.hit_rate_percent or 0 for p in week.points) == 75.0


def test_trends_show_only_the_viewers_tenants_and_narrow_to_one_tenant_and_tool(tenant, other_tenant, olga,
                                                                              django_user_model):
    calls(tenant, 2, executed=1)
    calls(tenant, 2, tool="create_ticket", executed=4)
    calls(other_tenant, 2, executed=8)
    root = django_user_model.objects.create_superuser("root", "r@example.invalid", "pw")

    def writes(who, **narrowed):
        return sum(p.writes for p in trends.trend(who, "hour", now=NOW, **narrowed).points)

    assert writes(olga) == 5 and writes(root) == 13
    assert writes(root, tenant_id=other_tenant.pk) == 8 and writes(olga, tool="create_ticket") == 4
    assert writes(olga, tenant_id=other_tenant.pk) == 0  # narrowing never widens


def test_the_dashboard_draws_each_seed_metric_for_the_tenant_and_tool_picked(client, tenant, other_tenant, olga):
    calls(tenant, 0, executed=1, replayed=1)
    calls(other_tenant, 0, conflict=5)
    client.force_login(olga)
    url = reverse("admin:tools_app_dashboard_changelist")

    week = client.get(url, {"window": "week", "tenant": tenant.pk, "tool": "create_order"})

    page = week.content.decode()
    assert week.status_code == 200 and week.context["trend"].window.name == "week"
    for chart in ("trend-hit-rate", "trend-conflict-rate", "trend-timeouts", "trend-unknown", "trend-duplicates",
                  "trend-latency"):
        assert f'id="{chart}"' in page, chart
    assert "50.0%" in page  # the hit rate of acme's create_order calls; globex's conflicts are not shown
    assert f'href="?window=day&amp;tenant={tenant.pk}&amp;tool=create_order"' in page  # the filters are kept
    stats = {s.tool: s for s in week.context["snapshot"].tools}
    assert list(stats) == ["create_order"] and stats["create_order"].writes == 2
