"""The operators' dashboard: counts and rates per tool over the last hour, day or week (trends.py
draws the seed metrics over time, per tenant and tool, from the same rows).

Call outcomes, replay latency and downstream duplicates come from the per-minute rows every
process writes (rollup.py, the source of `/metrics` too); what is stuck right now from the same
gauges `/metrics` serves (gauges.py). Everything is scoped to the tenants the viewer may see.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db.models import Count, Q
from django.utils import timezone

from tools_app import access
from tools_app.approvals.models import ApprovalRequest
from tools_app.core import counters
from tools_app.metrics import gauges, rollup
from tools_app.toolkit.calls import CallOutcome
from tools_app.toolkit.registry import all_tools


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


@dataclass
class ToolStats:
    tool: str
    writes_tool: bool = True
    outcomes: dict[str, int] = field(default_factory=dict)
    replay_p50_ms: float | None = None
    replay_p95_ms: float | None = None
    overrun_leases: int = 0  # PROCESSING past its lease now: the executor died or hangs
    # Downstream answers from its own idempotency store (our key came back to it) or refusals of a reused key.
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
        return self.calls if self.writes_tool else 0

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


def snapshot(viewer: object | None, window: str = "hour", now: datetime | None = None) -> Snapshot:
    """The figures of the tenants `viewer` may see (access.scope)."""
    now = now or timezone.now()
    win = WINDOWS.get(window, WINDOWS["hour"])
    since = now - win.length
    writes = {spec.name: spec.writes for spec in all_tools()}
    stats: dict[str, ToolStats] = {}

    def tool(name: str) -> ToolStats:
        if name not in stats:
            stats[name] = ToolStats(tool=name, writes_tool=writes.get(name, True))
        return stats[name]

    # Whole minutes: a minute's row counts in the window if it started inside it.
    start = rollup.step_start(since, timedelta(minutes=1))
    for (name, outcome), summed in rollup.totals(viewer, counters.TOOL_CALL, since=start, until=now).items():
        tool(name).outcomes[outcome] = summed.count
        if outcome == CallOutcome.REPLAYED:
            p50 = rollup.quantile(counters.TOOL_CALL, summed.buckets, 0.5)
            p95 = rollup.quantile(counters.TOOL_CALL, summed.buckets, 0.95)
            tool(name).replay_p50_ms = None if p50 is None else p50 * 1000
            tool(name).replay_p95_ms = None if p95 is None else p95 * 1000
    for (name,), summed in rollup.totals(viewer, counters.DOWNSTREAM_DUPLICATE, since=start, until=now,
                                         by=("tool",)).items():
        tool(name).downstream_duplicates = summed.count
    figures = gauges.now(viewer, now)
    for name, n in figures.overrun.items():
        tool(name).overrun_leases = n
    for name, n in figures.unknown.items():
        tool(name).unknown = n
    for name, n in figures.approvals_waiting.items():
        tool(name).approvals_waiting, tool(name).oldest_waiting = n, figures.approvals_oldest[name]
    oldest = min(figures.approvals_oldest.values(), default=None)
    # Expiry, execution and failure end a request without a decision time: count what ended in the window too.
    requests = access.scope(ApprovalRequest.objects.all(), viewer)
    decided = requests.filter(Q(decided_at__gt=since) | Q(finished_at__gt=since)).values("status").annotate(
        n=Count("id")).order_by()
    return Snapshot(
        window=win, now=now, tools=sorted(stats.values(), key=lambda s: s.tool),
        timeline=_timeline(viewer, writes, start, now, win.bucket),
        approvals_decided={row["status"]: row["n"] for row in decided},
        oldest_pending_age=now - oldest if oldest else None,
    )


def _timeline(viewer: object | None, writes: dict[str, bool], since: datetime, now: datetime, bucket: timedelta
              ) -> list[tuple[datetime, dict[str, int]]]:
    """Write calls per bucket and outcome, oldest bucket first, empty buckets included."""
    count = int((now - since) / bucket)
    start = now - count * bucket
    buckets: list[tuple[datetime, dict[str, int]]] = [(start + i * bucket, defaultdict(int)) for i in range(count)]
    for point in rollup.series(viewer, counters.TOOL_CALL, since=since, until=now):
        tool, label = point.tool or "", point.label or ""  # grouped by both: never None
        if not writes.get(tool, True):
            continue
        index = min(max(int((point.at - start) / bucket), 0), count - 1)
        buckets[index][1][label] += point.count
    return [(at, dict(outcomes)) for at, outcomes in buckets]
