"""Small inline-SVG charts of the trends (tools_app.metrics.trends): geometry only, drawn by the
dashboard template. No JavaScript and no external assets; each point carries a <title> tooltip.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tools_app.metrics import trends

WIDTH, HEIGHT, LEFT, TOP = 360, 120, 34, 8


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    color: str
    title: str


@dataclass(frozen=True)
class Line:
    label: str
    color: str
    segments: list[str]  # SVG polyline points, one string per unbroken run of values
    dots: list[tuple[float, float, str]]  # x, y, tooltip


@dataclass
class Chart:
    id: str
    title: str
    unit: str
    peak: float
    latest: str
    lines: list[Line] = field(default_factory=list)
    bars: list[Bar] = field(default_factory=list)
    width: int = WIDTH
    height: int = HEIGHT
    left: int = LEFT


Getter = Callable[[trends.Point], float | None]


def _scale(values: Sequence[float | None], fixed_peak: float | None) -> float:
    return fixed_peak or max([v for v in values if v is not None] + [1.0])


def _x(i: int, count: int) -> float:
    return LEFT + (i + 0.5) * (WIDTH - LEFT) / max(count, 1)


def _y(value: float, peak: float) -> float:
    return HEIGHT - value / peak * (HEIGHT - TOP)


def _label(point: trends.Point, bucket: str) -> str:
    return f"{point.at:%Y-%m-%d %H:%M} (+{bucket})"


def line_chart(chart_id: str, title: str, unit: str, trend: trends.Trend,
               series: list[tuple[str, str, Getter]], *, fixed_peak: float | None = None) -> Chart:
    points = trend.points
    values = {label: [get(p) for p in points] for label, _, get in series}
    peak = _scale([v for vs in values.values() for v in vs], fixed_peak)
    chart = Chart(chart_id, title, unit, peak, latest=_latest(values[series[0][0]], unit))
    for label, color, _ in series:
        segments: list[str] = []
        run: list[str] = []
        dots: list[tuple[float, float, str]] = []
        for i, value in enumerate(values[label]):
            if value is None:
                if run:
                    segments.append(" ".join(run))
                run = []
                continue
            x, y = _x(i, len(points)), _y(value, peak)
            run.append(f"{x:.1f},{y:.1f}")
            dots.append((x, y, f"{_label(points[i], trend.window.bucket_label)} {label}: {value:.1f}{unit}"))
        if run:
            segments.append(" ".join(run))
        chart.lines.append(Line(label, color, segments, dots))
    return chart


def bar_chart(chart_id: str, title: str, trend: trends.Trend, get: Getter, color: str) -> Chart:
    points = trend.points
    values = [get(p) or 0 for p in points]
    peak = _scale(values, None)
    slot = (WIDTH - LEFT) / max(len(points), 1)
    chart = Chart(chart_id, title, "", peak, latest=f"{sum(values):g} in all")
    for i, value in enumerate(values):
        if value:
            y = _y(value, peak)
            chart.bars.append(Bar(LEFT + i * slot + 0.5, y, max(slot - 1, 1), HEIGHT - y, color,
                                  f"{_label(points[i], trend.window.bucket_label)}: {value:g}"))
    return chart


def _latest(values: list[float | None], unit: str) -> str:
    known = [v for v in values if v is not None]
    return f"latest {known[-1]:.1f}{unit}" if known else "no data"


def seed_charts(trend: trends.Trend) -> list[Chart]:
    """The seed metrics, one chart each."""
    return [
        line_chart("trend-hit-rate", "Idempotency hit rate", "%", trend,
                   [("hit rate", "#417690", lambda p: p.hit_rate_percent)], fixed_peak=100),
        line_chart("trend-conflict-rate", "Key conflict rate", "%", trend,
                   [("conflict rate", "#ba2121", lambda p: p.conflict_rate_percent)]),
        bar_chart("trend-timeouts", "Processing timeouts (write leases expired)", trend,
                  lambda p: p.processing_timeouts, "#e08e0b"),
        line_chart("trend-unknown", "UNKNOWN records", "", trend, [("UNKNOWN", "#6f42c1", lambda p: p.unknown)]),
        bar_chart("trend-duplicates", "Downstream duplicates", trend, lambda p: p.downstream_duplicates, "#2f7d32"),
        line_chart("trend-latency", "Replay latency", " ms", trend,
                   [("p50", "#79aec8", lambda p: p.replay_p50_ms), ("p95", "#264b5d", lambda p: p.replay_p95_ms)]),
    ]
