"""The figures: counted in a process, written to the per-minute rows and the totals, queried per tenant
and tool, served at /metrics to the scrapers allowed, and what is stuck right now read from the rows.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

import psycopg
import pytest
from django.db import OperationalError, connection, transaction
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from tests.support.approvals_support import STAFF_NOTE, call
from tests.support.operators import make_operator
from tools_app import engine
from tools_app.access.roles import OPERATOR
from tools_app.conf import override_conf
from tools_app.core import counters
from tools_app.core.errors import ToolFailure
from tools_app.metrics import rollup
from tools_app.models import IdempotencyRecord, MetricMinute, MetricTotal, RecordStatus
from tools_app.toolkit.calls import CallOutcome, CallResult
from tools_app.toolkit.registry import all_tools, get_tool

ORDER = {"customer": "ACME", "currency": "EUR", "items": [{"sku": "A", "quantity": 1, "unit_price": "1.00"}]}


def samples(response) -> dict[str, list]:
    return {family.name: family.samples for family in text_string_to_metric_families(response.content.decode())}


def value(found: list, name: str, **labels: str) -> float:
    return sum(s.value for s in found if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


@pytest.fixture(autouse=True)
def _no_rows_from_a_stopped_process(db):
    """A web process or cluster another module started writes what it counted when it stops, after that
    module's last test emptied the tables: those rows are committed. Removed before the test, on a connection
    of their own (in the test's transaction the delete would hold a lock on the tables until its end)."""
    with psycopg.connect(**connection.get_connection_params(), autocommit=True) as other:
        other.execute(f"DELETE FROM {MetricMinute._meta.db_table}")
        other.execute(f"DELETE FROM {MetricTotal._meta.db_table}")


@pytest.fixture
def committing(django_capture_on_commit_callbacks):
    """Counts made in the test's transaction are added when it "commits" (here: at the end of the block)."""
    return lambda: django_capture_on_commit_callbacks(execute=True)


# --- counting ----------------------------------------------------------------------------------------------


def test_counts_from_two_flushes_add_up_in_the_minute_and_in_the_total(tenant, committing):
    with committing():
        counters.observe(counters.TOOL_CALL, 0.004, tool="create_order", tenant_id=tenant.pk, label="replayed")
        counters.observe(counters.TOOL_CALL, 0.3, tool="create_order", tenant_id=tenant.pk, label="replayed")
    counters.flush()
    with committing():
        counters.observe(counters.TOOL_CALL, 70, tool="create_order", tenant_id=tenant.pk, label="replayed")
    counters.flush()

    minute = MetricMinute.objects.get(metric="tool_call", tool="create_order", label="replayed")
    total = MetricTotal.objects.get(metric="tool_call", tool="create_order", label="replayed")
    for row in (minute, total):
        assert row.count == 3 and row.sum == pytest.approx(70.304) and row.tenant_id == tenant.pk
        # 0.004 in the first bucket (<= 5 ms), 0.3 in <= 0.5 s, 70 s above the last bound
        assert row.buckets[0] == 1 and row.buckets[counters.CALL_BUCKETS.index(0.5)] == 1 and row.buckets[-1] == 1
        assert sum(row.buckets) == 3


def test_a_count_made_in_a_transaction_that_rolls_back_is_never_written(tenant, committing):
    with committing():
        try:
            with transaction.atomic():
                counters.count(counters.PROCESSING_TIMEOUT, tool="create_order", tenant_id=tenant.pk)
                raise RuntimeError("the change did not happen")
        except RuntimeError:
            pass
        counters.count(counters.PROCESSING_TIMEOUT, tool="create_ticket", tenant_id=tenant.pk)
    counters.flush()

    assert list(MetricTotal.objects.values_list("tool", "count")) == [("create_ticket", 1)]


def test_a_count_in_an_event_loops_thread_is_added_at_once_and_builds_no_connection_for_the_request(
        tenant, monkeypatch):
    """The /mcp handlers count each call in the event loop's thread, where Django runs no ORM work and
    keeps a connection object per asyncio task: the count asks no connection whether it is in a
    transaction (that would build one per request, and its garbage)."""
    from django.db import connections

    built = []
    create = connections.create_connection
    monkeypatch.setattr(connections, "create_connection", lambda alias: built.append(alias) or create(alias))

    async def handler():
        counters.observe(counters.TOOL_CALL, 0.01, tool="whoami", tenant_id=tenant.pk, label="executed")

    async def requests():  # each request its own task, as the ASGI server runs them
        for _ in range(3):
            await asyncio.create_task(handler())

    asyncio.run(requests())
    counters.flush()

    assert built == []
    assert MetricTotal.objects.get(metric="tool_call", tool="whoami", label="executed").count == 3


def test_an_expired_executor_lease_counts_one_processing_timeout(caller, committing):
    result = call(caller, "create_order", idempotency_key="o-1", **ORDER)
    record = result.record
    IdempotencyRecord.objects.filter(pk=record.pk).update(status=RecordStatus.PROCESSING, lease_owner="dead",
                                                          lease_expires_at=timezone.now() - timedelta(seconds=1))
    with committing():
        assert len(engine.expire_leases()) == 1
        assert engine.expire_leases() == []  # the second sweep finds nothing: counted once
    counters.flush()

    total = MetricTotal.objects.get(metric="processing_timeout")
    assert (total.tool, total.tenant_id, total.count) == ("create_order", caller.tenant_id, 1)


@pytest.mark.parametrize(("error_class", "outcome"), [
    ("conflict", "conflict"), ("in_progress", "in_progress"), ("unknown_outcome", "unknown"),
    ("invalid_input", "rejected"), ("permission_denied", "rejected"), ("not_found", "rejected"),
    ("pending_approval", "pending_approval"), ("expired", "expired"), ("rate_limited", "rate_limited"),
    ("transient", "failed"), ("downstream_conflict", "failed"), ("already_done", "failed"),
])
def test_every_error_class_counts_as_one_of_the_ten_outcomes(error_class, outcome):
    # A failure of that class string (failures are immutable once built): `rate_limited` counts as it arrives.
    failure = type("Failure", (ToolFailure,), {"error_class": error_class})("m")
    result = CallResult(get_tool("create_order"), error=failure)

    assert result.outcome == outcome
    assert {o.value for o in CallOutcome} == {"executed", "replayed", "conflict", "in_progress", "unknown", "failed",
                                              "rejected", "pending_approval", "expired", "rate_limited"}


# --- the per-minute rows, per tenant and tool ------------------------------------------------------------


def test_a_series_groups_the_minutes_per_step_tenant_and_tool_for_the_tenants_a_viewer_may_see(
        tenant, other_tenant, committing):
    # Half past the hour (an hour or less ago): the two rows 2 h 10 and 2 h 5 before it share an hourly step.
    now = timezone.now().replace(minute=30, second=30, microsecond=0)
    now -= timedelta(hours=1) if now > timezone.now() else timedelta()
    rows = [(now - timedelta(hours=2, minutes=10), tenant.pk, "create_order", 3),
            (now - timedelta(hours=2, minutes=5), tenant.pk, "create_order", 2),
            (now - timedelta(minutes=5), tenant.pk, "create_order", 1),
            (now - timedelta(minutes=5), other_tenant.pk, "create_order", 7),
            (now - timedelta(minutes=5), tenant.pk, "create_ticket", 4)]
    for at, tenant_id, tool, n in rows:
        MetricMinute.objects.create(minute=at.replace(second=0), tenant_id=tenant_id, tool=tool, metric="tool_call",
                                    label="executed", count=n, sum=n * 0.01,
                                    buckets=[n] + [0] * len(counters.CALL_BUCKETS))
    operator = make_operator("olga", OPERATOR, tenant)

    hourly = rollup.series(operator, "tool_call", since=now - timedelta(hours=3), until=now, step=timedelta(hours=1),
                           tool="create_order", by=("tenant_id",))
    everyone = rollup.series(None, "tool_call", since=now - timedelta(hours=3), until=now, step=timedelta(hours=1),
                             tool="create_order", by=())

    assert [(p.tenant_id, p.count) for p in hourly] == [(tenant.pk, 5), (tenant.pk, 1)]
    assert hourly[0].at == rollup.step_start(now - timedelta(hours=2, minutes=10), timedelta(hours=1))
    assert [p.count for p in everyone] == [5, 8]
    assert everyone[1].buckets[0] == 8 and 0 < everyone[1].quantile(counters.TOOL_CALL, 0.5) <= 0.005
    with pytest.raises(ValueError, match="whole number of minutes"):
        rollup.series(None, "tool_call", since=now, step=timedelta(seconds=30))


def test_pruning_drops_minutes_past_their_retention_and_keeps_the_totals(tenant, settings, committing):
    override_conf(settings, metrics_retention_days=8)
    with committing():
        counters.count(counters.TASK_LEASE_EXPIRY, tool="ingest_document", tenant_id=tenant.pk)
    counters.flush()
    # Only this tenant's minute is aged: a count another test's thread made late (this process's counters are
    # shared) is of this minute, and stays, as a recent minute of this tenant does.
    MetricMinute.objects.filter(tenant_id=tenant.pk).update(minute=timezone.now() - timedelta(days=9))
    with committing():
        counters.count(counters.TASK_LEASE_EXPIRY, tool="recent", tenant_id=tenant.pk)
    counters.flush()

    assert rollup.prune() == 1
    assert list(MetricMinute.objects.filter(tenant_id=tenant.pk).values_list("tool", flat=True)) == ["recent"]
    assert MetricTotal.objects.get(tenant_id=tenant.pk, tool="ingest_document").count == 1


def test_the_flush_job_keeps_counts_it_could_not_write_for_the_next_flush(tenant, committing, monkeypatch):
    with committing():
        counters.count(counters.DOWNSTREAM_DUPLICATE, tool="request_payment", tenant_id=tenant.pk)

    def unreachable(rows):
        raise ConnectionError("the database is restarting")

    monkeypatch.setattr(counters, "_write", unreachable)
    with pytest.raises(ConnectionError):
        counters.flush()
    monkeypatch.undo()
    counters.flush()

    assert MetricTotal.objects.get(metric="downstream_duplicate").count == 1


def test_a_flush_that_meets_a_table_lock_gives_up_at_once_and_keeps_its_counts(tenant, committing):
    # A TRUNCATE or a migration holding the tables: waiting could deadlock with it.
    with committing():
        counters.count(counters.DOWNSTREAM_DUPLICATE, tool="request_payment", tenant_id=tenant.pk)
    with psycopg.connect(**connection.get_connection_params()) as other:
        other.execute(f"LOCK TABLE {MetricTotal._meta.db_table} IN ACCESS EXCLUSIVE MODE")
        with pytest.raises(OperationalError, match="lock timeout"):
            counters.flush()
    counters.flush()

    assert MetricTotal.objects.get(metric="downstream_duplicate").count == 1


# --- /metrics ------------------------------------------------------------------------------------------------


def test_metrics_answer_this_machine_and_refuse_other_addresses_without_the_token(db, settings):
    override_conf(settings, metrics_token="the-scrape-token")
    local = Client(REMOTE_ADDR="127.0.0.1").get("/metrics")
    remote = Client(REMOTE_ADDR="10.1.2.3").get("/metrics")
    remote_with_token = Client(REMOTE_ADDR="10.1.2.3").get("/metrics", HTTP_AUTHORIZATION="Bearer the-scrape-token")
    remote_wrong_token = Client(REMOTE_ADDR="10.1.2.3").get("/metrics", HTTP_AUTHORIZATION="Bearer guess")
    override_conf(settings, metrics_allowed_networks=["10.0.0.0/8"])
    allowed_network = Client(REMOTE_ADDR="10.1.2.3").get("/metrics")

    assert local.status_code == 200 and remote_with_token.status_code == 200 and allowed_network.status_code == 200
    assert remote.status_code == 403 and "IDEMOPS_METRICS_ALLOWED_NETWORKS" in remote.json()["error"]["message"]
    assert remote_wrong_token.status_code == 401 and remote_wrong_token.json()["error"]["class"] == "permission_denied"


def test_metrics_without_a_token_setting_refuse_any_presented_token(db):
    assert Client(REMOTE_ADDR="127.0.0.1").get("/metrics", HTTP_AUTHORIZATION="Bearer anything").status_code == 401


def test_metrics_show_what_is_stuck_now_and_zero_for_what_could_happen(caller, committing):
    call(caller, "publish_announcement", idempotency_key="a-1", **STAFF_NOTE)  # waits for a person
    done = call(caller, "create_order", idempotency_key="o-1", **ORDER)
    IdempotencyRecord.objects.filter(pk=done.record.pk).update(status=RecordStatus.UNKNOWN)

    found = samples(Client(REMOTE_ADDR="127.0.0.1").get("/metrics"))

    writes = {spec.name for spec in all_tools() if spec.writes}
    assert {s.labels["tool"] for s in found["idemops_processing_timeouts"]} == writes
    assert value(found["idemops_unknown_records"], "idemops_unknown_records", tool="create_order") == 1
    assert value(found["idemops_unknown_records"], "idemops_unknown_records", tool="create_ticket") == 0
    assert value(found["idemops_approvals_waiting"], "idemops_approvals_waiting", tool="publish_announcement") == 1
    assert value(found["idemops_approvals_oldest_waiting_seconds"], "idemops_approvals_oldest_waiting_seconds",
                 tool="publish_announcement") >= 0
    steps = {s.labels["step"] for s in found["idemops_task_step_seconds"] if s.name.endswith("_count")}
    assert steps == {step.name for spec in all_tools() if spec.pipeline is not None for step in spec.pipeline.steps}
    assert {s.labels["status"] for s in found["idemops_tasks"]} == {"created", "running", "paused", "retrying"}
    assert value(found["idemops_outbox_delivery_lag_seconds"], "idemops_outbox_delivery_lag_seconds_count") == 0


def test_metrics_show_the_jobs_waiting_and_taken_and_how_long_the_oldest_has_waited(caller, fast):
    from django.db.models import F
    from django_q.models import OrmQ

    from tests.support.tasks_support import TEXT, start

    # given three queued jobs (no cluster runs here): one waiting 90 s, one taken by a cluster
    for key in ("q-1", "q-2", "q-3"):
        start(caller, {"text": TEXT}, key=key)
    first, second, *_ = OrmQ.objects.order_by("id")
    OrmQ.objects.filter(pk=first.pk).update(lock=F("lock") - timedelta(seconds=90))
    OrmQ.objects.filter(pk=second.pk).update(lock=timezone.now() + timedelta(minutes=10))

    found = samples(Client(REMOTE_ADDR="127.0.0.1").get("/metrics"))

    waiting = OrmQ.objects.filter(lock__lte=timezone.now()).count()
    assert value(found["idemops_jobs_queued"], "idemops_jobs_queued", state="waiting") == waiting == 2
    assert value(found["idemops_jobs_queued"], "idemops_jobs_queued", state="taken") == 1
    assert 90 <= value(found["idemops_jobs_oldest_waiting_seconds"], "idemops_jobs_oldest_waiting_seconds") < 120
    assert value(found["idemops_job_clusters"], "idemops_job_clusters") == 0  # no cluster's heartbeat here
