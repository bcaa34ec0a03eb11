"""The seed metrics over time, per tenant and tool: the dashboard's trend charts.

Hit rate, conflict rate, processing timeouts (write leases that expired), UNKNOWN records,
downstream duplicates and replay latency p50/p95, per bucket of the last hour, day or week.

`trend` is the one function that reads the metrics' source: the per-minute rows every process
writes (tools_app.metrics.rollup.series, the rows `/metrics` and the dashboard read) for calls and
their outcomes, replay latency (the replayed calls' histogram), processing timeouts and
downstream duplicates. UNKNOWN over time is the count of UNKNOWN records now, walked back through
the audit log's moves into and out of UNKNOWN: the rollup holds that figure only as a gauge of now.
Buckets are the rollup's steps (rollup.step_start), the last one holding `now`.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypedDict

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import BigIntegerField, Count, Exists, Func, IntegerField, OuterRef, QuerySet, Value
from django.db.models.functions import Cast
from django.db.models.sql.compiler import SQLCompiler
from django.utils import timezone

from tools_app import access
from tools_app.core import counters
from tools_app.core.models import AuditEvent
from tools_app.engine.models import IdempotencyRecord, RecordStatus
from tools_app.metrics import rollup
from tools_app.metrics.dashboard import Window
from tools_app.toolkit.calls import CallOutcome
from tools_app.toolkit.registry import all_tools

if TYPE_CHECKING:  # a development dependency (django-stubs), for the checker only
    from django_stubs_ext import WithAnnotations


class Bucketed(TypedDict):
    """The column bucketed() adds to audit events: their BucketIndex."""

    bucket: int

# The dashboard's windows (dashboard.Window), with the finer steps a chart needs.
WINDOWS = {
    "hour": Window("hour", timedelta(hours=1), timedelta(minutes=1), "minute"),
    "day": Window("day", timedelta(days=1), timedelta(minutes=15), "15 minutes"),
    "week": Window("week", timedelta(days=7), timedelta(hours=2), "2 hours"),
}

# Audit actions that move a record into and out of UNKNOWN (tools_app.engine.transitions).
ENTERED_UNKNOWN, LEFT_UNKNOWN = "record.unknown", "record.reconciled"


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

    def percent(self, outcome: str) -> float | None:
        return self.outcomes.get(outcome, 0) / self.writes * 100 if self.writes else None

    @property
    def hit_rate_percent(self) -> float | None:
        return self.percent(CallOutcome.REPLAYED)

    @property
    def conflict_rate_percent(self) -> float | None:
        return self.percent(CallOutcome.CONFLICT)


@dataclass
class Trend:
    window: Window
    now: datetime
    tenant_id: int | None
    tool: str | None
    points: list[Point]


class BucketIndex(Func):
    """Which bucket of `seconds` after `start` a timestamp column falls in: 0 for [start, start + seconds),
    1 for the next, … (as the rollup's steps)."""

    output_field = IntegerField()

    def __init__(self, expression: str, start: datetime, seconds: float) -> None:
        super().__init__(expression, Value(start), Value(seconds))

    def as_sql(self, compiler: SQLCompiler, connection: BaseDatabaseWrapper, function: str | None = None,
               template: str | None = None, arg_joiner: str | None = None, **extra_context: Any
               ) -> tuple[str, tuple[Any, ...]]:
        (column, column_params), (start, start_params), (seconds, seconds_params) = (
            compiler.compile(e) for e in self.get_source_expressions())
        return (f"FLOOR(EXTRACT(EPOCH FROM ({column} - {start})) / {seconds})::integer",
                (*column_params, *start_params, *seconds_params))


def trend(viewer: object | None, window: str = "hour", *, tenant_id: int | None = None, tool: str | None = None,
          now: datetime | None = None) -> Trend:
    """The seed metrics per bucket of `window`, over the tenants `viewer` may see (access.scope),
    narrowed to `tenant_id` and `tool` when given."""
    now = now or timezone.now()
    win = WINDOWS.get(window, WINDOWS["hour"])
    count = int(win.length / win.bucket)
    start = rollup.step_start(now, win.bucket) - (count - 1) * win.bucket
    points = [Point(at=start + i * win.bucket) for i in range(count)]
    at = {point.at: point for point in points}
    seconds = win.bucket.total_seconds()

    def series(metric: counters.Metric, by: tuple[str, ...] = ()) -> list[rollup.Point]:
        found = rollup.series(viewer, metric, since=start, until=now, step=win.bucket, by=by, tenant_id=tenant_id,
                              tool=tool)
        return [step for step in found if step.at in at]

    _add_call_outcomes(at, series(counters.TOOL_CALL, ("tool", "label")))
    for step in series(counters.PROCESSING_TIMEOUT):
        at[step.at].processing_timeouts = step.count
    for step in series(counters.DOWNSTREAM_DUPLICATE):
        at[step.at].downstream_duplicates = step.count

    # UNKNOWN at each bucket's end: the count now, walked back through the moves in and out of it.
    def bucketed(rows: QuerySet[AuditEvent], column: str) -> QuerySet[WithAnnotations[AuditEvent, Bucketed]]:
        return rows.annotate(bucket=BucketIndex(column, start, seconds)).filter(bucket__gte=0, bucket__lt=count)

    events = _record_events(viewer, tenant_id, tool).filter(created_at__gte=start, created_at__lte=now)
    moves: dict[int, int] = defaultdict(int)
    for action, sign in ((ENTERED_UNKNOWN, 1), (LEFT_UNKNOWN, -1)):
        for row in bucketed(events.filter(action=action), "created_at").values("bucket").annotate(n=Count("id")):
            moves[row["bucket"]] += sign * row["n"]
    records = _narrow(access.scope(IdempotencyRecord.objects.all(), viewer), tenant_id, tool)
    unknown = records.filter(status=RecordStatus.UNKNOWN).count()
    for i in range(count - 1, -1, -1):
        points[i].unknown = max(unknown, 0)
        unknown -= moves.get(i, 0)
    return Trend(window=win, now=now, tenant_id=tenant_id, tool=tool, points=points)


def _add_call_outcomes(at: dict[datetime, Point], steps: list[rollup.Point]) -> None:
    """Count the write tools' calls by outcome into their points (`steps`: grouped by tool and outcome), with
    the replays' p50 and p95."""
    writes = {spec.name: spec.writes for spec in all_tools()}
    replayed: dict[datetime, list[int]] = {}
    for step in steps:
        tool_name, label = step.tool or "", step.label or ""  # grouped by both: never None
        if not writes.get(tool_name, True):  # a read tool's calls: the rates are of writes
            continue
        point = at[step.at]
        point.outcomes[label] = point.outcomes.get(label, 0) + step.count
        if step.label == CallOutcome.REPLAYED and step.buckets is not None:  # several tools: add their histograms
            seen = replayed.get(step.at)
            replayed[step.at] = step.buckets if seen is None else [a + b for a, b in zip(seen, step.buckets,
                                                                                       strict=True)]
    for moment, buckets in replayed.items():
        at[moment].replay_p50_ms = _ms(rollup.quantile(counters.TOOL_CALL, buckets, 0.5))
        at[moment].replay_p95_ms = _ms(rollup.quantile(counters.TOOL_CALL, buckets, 0.95))


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


def _narrow(rows: QuerySet[IdempotencyRecord], tenant_id: int | None, tool: str | None
            ) -> QuerySet[IdempotencyRecord]:
    if tenant_id is not None:
        rows = rows.filter(tenant_id=tenant_id)
    if tool:
        rows = rows.filter(tool=tool)
    return rows


def _record_events(viewer: object | None, tenant_id: int | None, tool: str | None) -> QuerySet[AuditEvent]:
    """Audit events about records, scoped like the records (an event names its record by id)."""
    events = access.scope(AuditEvent.objects.filter(object_type="idempotencyrecord"), viewer)
    if tenant_id is not None:
        events = events.filter(tenant_id=tenant_id)
    if tool:
        of_tool = IdempotencyRecord.objects.filter(pk=Cast(OuterRef("object_id"), BigIntegerField()), tool=tool)
        events = events.filter(Exists(of_tool))
    return events
