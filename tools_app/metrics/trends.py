"""The seed metrics over time, per tenant and tool: the dashboard's trend charts.

Hit rate, conflict rate, processing timeouts (write leases that expired), UNKNOWN records,
downstream duplicates and replay latency p50/p95, per bucket of the last hour, day or week.

`trend` is the one function that reads the metrics' source. Today that source is what the
platform already writes: CallEvent rows (one per tool call, written in batches by each web
process) for calls, outcomes and latencies; the audit log for leases that expired and for
records entering and leaving UNKNOWN; the records' evidence for downstream duplicates. Issue 11's
per-minute rollup (the source /metrics reads) replaces the body of `trend`, not its callers.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db.models import BigIntegerField, Count, Exists, Func, IntegerField, OuterRef, QuerySet, Value
from django.db.models.functions import Cast
from django.utils import timezone

from tools_app import access
from tools_app.core.models import AuditEvent
from tools_app.engine.models import IdempotencyRecord, RecordStatus
from tools_app.metrics.dashboard import PercentileCont
from tools_app.metrics.models import CallEvent
from tools_app.toolkit.calls import CallOutcome


@dataclass(frozen=True)
class Window:
    name: str
    length: timedelta
    bucket: timedelta
    bucket_label: str


WINDOWS = {
    "hour": Window("hour", timedelta(hours=1), timedelta(minutes=1), "minute"),
    "day": Window("day", timedelta(days=1), timedelta(minutes=15), "15 minutes"),
    "week": Window("week", timedelta(days=7), timedelta(hours=2), "2 hours"),
}

# Audit actions that move a record into and out of UNKNOWN (tools_app.engine.transitions).
ENTERED_UNKNOWN, LEFT_UNKNOWN, LEASE_EXPIRED = "record.unknown", "record.reconciled", "lease expired"


@dataclass
class Point:
    at: datetime  # the bucket's start
    outcomes: dict[str, int] = field(default_factory=dict)  # write-call outcome -> calls
    replay_p50_ms: float | None = None
    replay_p95_ms: float | None = None
    processing_timeouts: int = 0  # write leases that expired (the executor died or hung)
    downstream_duplicates: int = 0  # operations the downstream answered from its own idempotency store
    unknown: int = 0  # records in UNKNOWN at the bucket's end

    @property
    def writes(self) -> int:
        return sum(self.outcomes.values())

    def rate(self, outcome: str) -> float | None:
        return self.outcomes.get(outcome, 0) / self.writes * 100 if self.writes else None

    @property
    def hit_rate(self) -> float | None:
        return self.rate(CallOutcome.REPLAYED)

    @property
    def conflict_rate(self) -> float | None:
        return self.rate(CallOutcome.CONFLICT)


@dataclass
class Trend:
    window: Window
    now: datetime
    tenant_id: int | None
    tool: str | None
    points: list[Point]


class BucketIndex(Func):
    """Which bucket of `seconds` after `start` a timestamp column falls in: 0 for (start, start + seconds],
    1 for the next, … (closed at the end, so a row at `now` is in the last bucket)."""

    output_field = IntegerField()

    def __init__(self, expression, start: datetime, seconds: float):
        super().__init__(expression, Value(start), Value(seconds))

    def as_sql(self, compiler, connection, **extra_context):
        (column, column_params), (start, start_params), (seconds, seconds_params) = (
            compiler.compile(e) for e in self.get_source_expressions())
        return (f"CEIL(EXTRACT(EPOCH FROM ({column} - {start})) / {seconds})::integer - 1",
                (*column_params, *start_params, *seconds_params))


def trend(viewer, window: str = "hour", *, tenant_id: int | None = None, tool: str | None = None,
          now: datetime | None = None) -> Trend:
    """The seed metrics per bucket of `window`, over the tenants `viewer` may see (access.scope),
    narrowed to `tenant_id` and `tool` when given."""
    now = now or timezone.now()
    win = WINDOWS.get(window, WINDOWS["hour"])
    count = int(win.length / win.bucket)
    start = now - count * win.bucket
    points = [Point(at=start + i * win.bucket) for i in range(count)]
    seconds = win.bucket.total_seconds()

    def bucketed(rows: QuerySet, column: str) -> QuerySet:
        return rows.annotate(bucket=BucketIndex(column, start, seconds)).filter(bucket__gte=0, bucket__lt=count)

    calls = _narrow(access.scope(CallEvent.objects.filter(created_at__gt=start, created_at__lte=now), viewer),
                    tenant_id, tool).exclude(outcome=CallOutcome.READ)
    for row in bucketed(calls, "created_at").values("bucket", "outcome").annotate(n=Count("id")):
        points[row["bucket"]].outcomes[row["outcome"]] = row["n"]
    replays = bucketed(calls.filter(outcome=CallOutcome.REPLAYED), "created_at").values("bucket").annotate(
        p50=PercentileCont("latency_ms", 0.5), p95=PercentileCont("latency_ms", 0.95))
    for row in replays:
        points[row["bucket"]].replay_p50_ms, points[row["bucket"]].replay_p95_ms = row["p50"], row["p95"]

    records = _narrow(access.scope(IdempotencyRecord.objects.all(), viewer), tenant_id, tool)
    events = _record_events(viewer, tenant_id, tool).filter(created_at__gt=start, created_at__lte=now)
    for row in bucketed(events.filter(action=ENTERED_UNKNOWN, reason=LEASE_EXPIRED), "created_at").values(
            "bucket").annotate(n=Count("id")):
        points[row["bucket"]].processing_timeouts = row["n"]
    duplicates = records.filter(created_at__gt=start - timedelta(hours=1), finished_at__gt=start,
                                finished_at__lte=now, evidence__contains=[{"answer": {"deduplicated": True}}])
    for row in bucketed(duplicates, "finished_at").values("bucket").annotate(n=Count("id")):
        points[row["bucket"]].downstream_duplicates = row["n"]

    # UNKNOWN at each bucket's end: the count now, walked back through the moves in and out of it.
    moves: dict[int, int] = defaultdict(int)
    for action, sign in ((ENTERED_UNKNOWN, 1), (LEFT_UNKNOWN, -1)):
        for row in bucketed(events.filter(action=action), "created_at").values("bucket").annotate(n=Count("id")):
            moves[row["bucket"]] += sign * row["n"]
    unknown = records.filter(status=RecordStatus.UNKNOWN).count()
    for i in range(count - 1, -1, -1):
        points[i].unknown = max(unknown, 0)
        unknown -= moves.get(i, 0)
    return Trend(window=win, now=now, tenant_id=tenant_id, tool=tool, points=points)


def _narrow(rows: QuerySet, tenant_id: int | None, tool: str | None) -> QuerySet:
    if tenant_id is not None:
        rows = rows.filter(tenant_id=tenant_id)
    if tool:
        rows = rows.filter(tool=tool)
    return rows


def _record_events(viewer, tenant_id: int | None, tool: str | None) -> QuerySet:
    """Audit events about records, scoped like the records (an event names its record by id)."""
    events = access.scope(AuditEvent.objects.filter(object_type="idempotencyrecord"), viewer)
    if tenant_id is not None:
        events = events.filter(tenant_id=tenant_id)
    if tool:
        of_tool = IdempotencyRecord.objects.filter(pk=Cast(OuterRef("object_id"), BigIntegerField()), tool=tool)
        events = events.filter(Exists(of_tool))
    return events
