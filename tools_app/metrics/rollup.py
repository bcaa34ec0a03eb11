"""The per-minute rows every process writes (tools_app.core.counters): queried per tenant, tool,
label and time step, summed as histograms where they are, and pruned after their retention.

`series` is the one query over them: the dashboard uses it, and so can any chart of a tenant's or
a tool's calls over an hour, a day or a week (docs/observability.md shows how).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db.models import QuerySet
from django.utils import timezone

from tools_app import access
from tools_app.conf import conf
from tools_app.core.counters import METRICS, Metric
from tools_app.core.models import MetricMinute

GROUPS = ("tenant_id", "tool", "label")
EPOCH = datetime(2000, 1, 3, tzinfo=UTC)  # a Monday: weekly steps start on Mondays


@dataclass
class Point:
    """One step of a series: what was counted from `at` for `step`, for one group."""

    at: datetime
    tenant_id: int | None = None  # None: summed over tenants (not grouped by tenant)
    tool: str | None = None
    label: str | None = None
    count: int = 0
    sum: float = 0.0
    buckets: list[int] | None = None

    def quantile(self, metric: Metric, q: float) -> float | None:
        return quantile(metric, self.buckets, q)


@dataclass
class Totals:
    """Everything counted in a window for one group (no time steps)."""

    count: int = 0
    sum: float = 0.0
    buckets: list[int] | None = field(default=None)


def _rows(viewer: object | None, metric: Metric, since: datetime, until: datetime, *, tenant_id: int | None = None,
          tool: str | None = None, label: str | None = None) -> QuerySet[MetricMinute]:
    rows = MetricMinute.objects.filter(metric=metric.name, minute__gte=since, minute__lt=until)
    if viewer is not None:
        rows = access.scope(rows, viewer)
    if tenant_id is not None:
        rows = rows.filter(tenant_id=tenant_id)
    if tool is not None:
        rows = rows.filter(tool=tool)
    if label is not None:
        rows = rows.filter(label=label)
    return rows


def _add(into: Point | Totals, count: int, total: float, buckets: list[int] | None) -> None:
    into.count += count
    into.sum += total
    if buckets is not None:
        into.buckets = list(buckets) if into.buckets is None else [a + b for a, b in zip(into.buckets, buckets,
                                                                                          strict=True)]


def step_start(moment: datetime, step: timedelta) -> datetime:
    """The start of the step `moment` falls in (steps counted from a Monday, UTC)."""
    return moment - (moment - EPOCH) % step


def series(viewer: object | None, metric: Metric | str, *, since: datetime, until: datetime | None = None,
           step: timedelta = timedelta(minutes=1), by: Sequence[str] = ("tool", "label"),
           tenant_id: int | None = None, tool: str | None = None, label: str | None = None) -> list[Point]:
    """What `metric` counted from `since` to `until` (default: now), in steps of `step` (a whole
    number of minutes), grouped `by` any of tenant_id, tool and label, for the tenants `viewer` may
    see (None: all, for the system's own use). Steps with nothing counted are left out; points
    come oldest first."""
    metric = METRICS[metric] if isinstance(metric, str) else metric
    unknown = set(by) - set(GROUPS)
    if unknown:
        raise ValueError(f"series can be grouped by {', '.join(GROUPS)}, not {', '.join(sorted(unknown))}")
    if step < timedelta(minutes=1) or step % timedelta(minutes=1):
        raise ValueError("a series' step is a whole number of minutes")
    until = until or timezone.now()
    points: dict[tuple[Any, ...], Point] = {}
    rows = _rows(viewer, metric, since, until, tenant_id=tenant_id, tool=tool, label=label)
    for minute, *group, count, total, buckets in rows.values_list("minute", *by, "count", "sum", "buckets"):
        at = step_start(minute, step)
        point = points.get((at, *group))
        if point is None:
            point = points[(at, *group)] = Point(at=at, **dict(zip(by, group, strict=True)))
        _add(point, count, total, buckets)
    return sorted(points.values(), key=lambda p: (p.at, p.tenant_id or 0, p.tool or "", p.label or ""))


def totals(viewer: object | None, metric: Metric, *, since: datetime, until: datetime | None = None,
           by: Iterable[str] = ("tool", "label")) -> dict[tuple[Any, ...], Totals]:
    """What `metric` counted in the window, per group (the tuple of the `by` values)."""
    by = tuple(by)
    summed: dict[tuple[Any, ...], Totals] = {}
    for *group, count, total, buckets in _rows(viewer, metric, since, until or timezone.now()).values_list(
            *by, "count", "sum", "buckets"):
        _add(summed.setdefault(tuple(group), Totals()), count, total, buckets)
    return summed


def quantile(metric: Metric, buckets: list[int] | None, q: float) -> float | None:
    """The `q`-quantile of a histogram's counts, in seconds, interpolated within its bucket as
    Prometheus' histogram_quantile does; None without observations."""
    if not buckets or not metric.buckets or not sum(buckets):
        return None
    rank, seen = q * sum(buckets), 0
    for index, n in enumerate(buckets):
        if n and seen + n >= rank:
            if index >= len(metric.buckets):  # above the last bound: the last bound is all we know
                return metric.buckets[-1]
            lower = metric.buckets[index - 1] if index else 0.0
            return lower + (metric.buckets[index] - lower) * (rank - seen) / n
        seen += n
    return metric.buckets[-1]


def prune(now: datetime | None = None) -> int:
    """Delete per-minute rows older than IDEMOPS_METRICS_RETENTION_DAYS (the totals stay)."""
    cutoff = (now or timezone.now()) - timedelta(days=conf().metrics_retention_days)
    deleted, _ = MetricMinute.objects.filter(minute__lt=cutoff).delete()
    return deleted
