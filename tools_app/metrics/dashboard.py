"""The operators' dashboard: counts and rates per tool over the last hour, day or week (trends.py
draws the same figures over time).

Call outcomes come from CallEvent (tools_app.metrics, written in batches by
the MCP server); what is stuck right now comes from the records and the
approval requests. Everything is scoped to the tenants the viewer may see.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db.models import Aggregate, Count, FloatField, Min, Q, QuerySet
from django.db.models.functions import TruncMinute
from django.utils import timezone

from tools_app import access
from tools_app.approvals.models import ApprovalRequest, ApprovalStatus
from tools_app.engine.models import IdempotencyRecord, RecordStatus
from tools_app.metrics.models import CallEvent
from tools_app.toolkit.calls import CallOutcome


@dataclass(frozen=True)
class Window:
    name: str
    length: timedelta
    bucket: timedelta
    bucket_label: str


WINDOWS = {
    "hour": Window("hour", timedelta(hours=1), timedelta(minutes=5), "5 minutes"),
    "day": Window("day", timedelta(days=1), timedelta(hours=1), "hour"),
    "week": Window("week", timedelta(days=7), timedelta(hours=6), "6 hours"),
}


class PercentileCont(Aggregate):
    function = "percentile_cont"
    template = "%(function)s(%(percentile)s) WITHIN GROUP (ORDER BY %(expressions)s)"
    output_field = FloatField()

    def __init__(self, expression, percentile: float, **extra):
        super().__init__(expression, percentile=percentile, **extra)


@dataclass
class ToolStats:
    tool: str
    outcomes: dict[str, int] = field(default_factory=dict)
    replay_p50_ms: float | None = None
    replay_p95_ms: float | None = None
    overrun_leases: int = 0  # PROCESSING past its lease now: the executor died or hangs
    # Operations the downstream answered from its own idempotency store (our key came back to it).
    downstream_duplicates: int = 0
    unknown: int = 0  # records in UNKNOWN now
    approvals_waiting: int = 0
    oldest_waiting: datetime | None = None

    def count(self, outcome: str) -> int:
        return self.outcomes.get(outcome, 0)

    @property
    def calls(self) -> int:
        return sum(self.outcomes.values())

    @property
    def writes(self) -> int:
        return self.calls - self.count(CallOutcome.READ)

    def rate(self, outcome: str) -> float | None:
        return self.count(outcome) / self.writes if self.writes else None

    @property
    def hit_rate(self) -> float | None:
        """Share of write calls answered from the store (a replay) instead of executing."""
        return self.rate(CallOutcome.REPLAYED)

    @property
    def conflict_rate(self) -> float | None:
        return self.rate(CallOutcome.CONFLICT)

    @property
    def hit_rate_percent(self) -> float | None:
        return None if self.hit_rate is None else self.hit_rate * 100

    @property
    def conflict_rate_percent(self) -> float | None:
        return None if self.conflict_rate is None else self.conflict_rate * 100


@dataclass
class Snapshot:
    window: Window
    now: datetime
    tools: list[ToolStats]
    timeline: list[tuple[datetime, dict[str, int]]]  # bucket start -> outcome -> calls
    approvals_decided: dict[str, int]  # approved/executed/rejected/expired/failed in the window
    oldest_pending_age: timedelta | None


def snapshot(viewer, window: str = "hour", now: datetime | None = None, *, tenant_id: int | None = None,
             tool: str | None = None) -> Snapshot:
    """The figures of the tenants `viewer` may see (access.scope), of one tenant or tool when given."""
    now = now or timezone.now()
    win = WINDOWS.get(window, WINDOWS["hour"])
    since = now - win.length
    only_tool = tool  # `tool` names a helper below

    def narrow(rows: QuerySet) -> QuerySet:
        rows = access.scope(rows, viewer)
        if tenant_id is not None:
            rows = rows.filter(tenant_id=tenant_id)
        return rows.filter(tool=only_tool) if only_tool else rows

    calls = narrow(CallEvent.objects.filter(created_at__gt=since, created_at__lte=now))
    stats: dict[str, ToolStats] = defaultdict(lambda: ToolStats(tool=""))

    def tool(name: str) -> ToolStats:
        stats[name].tool = name
        return stats[name]

    for row in calls.values("tool", "outcome").annotate(n=Count("id")):
        tool(row["tool"]).outcomes[row["outcome"]] = row["n"]
    replays = calls.filter(outcome=CallOutcome.REPLAYED).values("tool").annotate(
        p50=PercentileCont("latency_ms", 0.5), p95=PercentileCont("latency_ms", 0.95))
    for row in replays:
        tool(row["tool"]).replay_p50_ms, tool(row["tool"]).replay_p95_ms = row["p50"], row["p95"]
    records = narrow(IdempotencyRecord.objects.all())
    for row in records.filter(status=RecordStatus.PROCESSING, lease_expires_at__lt=now).values("tool").annotate(
            n=Count("id")):
        tool(row["tool"]).overrun_leases = row["n"]
    for row in records.filter(status=RecordStatus.UNKNOWN).values("tool").annotate(n=Count("id")):
        tool(row["tool"]).unknown = row["n"]
    # created_at bounds the scan with an index; an operation finishing in the window started shortly before.
    deduplicated = records.filter(created_at__gt=since - timedelta(hours=1), finished_at__gt=since,
                                  evidence__contains=[{"answer": {"deduplicated": True}}])
    for row in deduplicated.values("tool").annotate(n=Count("id")):
        tool(row["tool"]).downstream_duplicates = row["n"]
    requests = narrow(ApprovalRequest.objects.all())
    pending = requests.filter(status=ApprovalStatus.PENDING)
    for row in pending.values("tool").annotate(n=Count("id"), oldest=Min("created_at")):
        tool(row["tool"]).approvals_waiting, tool(row["tool"]).oldest_waiting = row["n"], row["oldest"]
    oldest = pending.aggregate(oldest=Min("created_at"))["oldest"]
    # Expiry, execution and failure end a request without a decision time: count what ended in the window too.
    decided = requests.filter(Q(decided_at__gt=since) | Q(finished_at__gt=since)).values("status").annotate(
        n=Count("id"))
    return Snapshot(
        window=win, now=now, tools=sorted(stats.values(), key=lambda s: s.tool),
        timeline=_timeline(calls, since, now, win.bucket),
        approvals_decided={row["status"].lower(): row["n"] for row in decided},
        oldest_pending_age=now - oldest if oldest else None,
    )


def _timeline(calls: QuerySet, since: datetime, now: datetime, bucket: timedelta
              ) -> list[tuple[datetime, dict[str, int]]]:
    """Calls per bucket and outcome, oldest bucket first, empty buckets included."""
    count = int((now - since) / bucket)
    start = now - count * bucket
    buckets: list[tuple[datetime, dict[str, int]]] = [(start + i * bucket, defaultdict(int)) for i in range(count)]
    per_minute = calls.annotate(minute=TruncMinute("created_at")).values("minute", "outcome").annotate(n=Count("id"))
    for row in per_minute:
        index = min(max(int((row["minute"] - start) / bucket), 0), count - 1)
        buckets[index][1][row["outcome"]] += row["n"]
    return [(at, dict(outcomes)) for at, outcomes in buckets]
