"""The dashboard page: /admin/tools_app/dashboard/ (the Dashboard proxy's list page).

The figures of the last hour, day or week, of every tenant the viewer may see, and the seed
metrics as trend charts over the same window, of those tenants or of one tenant and one tool (the
filters are in the URL; tools_app.metrics.trends, drawn by tools_app.admin.charts). Plain HTML, CSS and inline
SVG: no JavaScript and no CDN.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.urls import URLPattern, path

from tools_app import access
from tools_app.access.models import Tenant
from tools_app.admin import charts
from tools_app.admin.operator_actions import age
from tools_app.admin.scoping import ReadOnlyAdmin
from tools_app.core import replicas
from tools_app.metrics import dashboard, trends
from tools_app.metrics.models import Dashboard
from tools_app.toolkit import registry
from tools_app.toolkit.calls import CallOutcome

# Write-call outcomes in the charts, bottom to top, with their colours.
SERIES = [
    (CallOutcome.EXECUTED, "#417690"),
    (CallOutcome.REPLAYED, "#79aec8"),
    (CallOutcome.PENDING_APPROVAL, "#c9a227"),
    (CallOutcome.CONFLICT, "#ba2121"),
    (CallOutcome.IN_PROGRESS, "#e08e0b"),
    (CallOutcome.UNKNOWN, "#6f42c1"),
    (CallOutcome.FAILED, "#999999"),
    (CallOutcome.REJECTED, "#cccccc"),
    (CallOutcome.EXPIRED, "#8a6d3b"),
    (CallOutcome.RATE_LIMITED, "#d9534f"),
]
CHART_WIDTH, CHART_HEIGHT, AXIS = 720, 180, 28


def timeline_rects(snapshot: dashboard.Snapshot) -> tuple[list[charts.Bar], int]:
    """Stacked columns, one per bucket; returns the rectangles and the tallest column's total."""
    totals = [sum(outcomes.get(s, 0) for s, _ in SERIES) for _, outcomes in snapshot.timeline]
    peak = max(totals, default=0) or 1
    slot = (CHART_WIDTH - AXIS) / max(len(snapshot.timeline), 1)
    rects = []
    for i, (at, outcomes) in enumerate(snapshot.timeline):
        y: float = CHART_HEIGHT
        for outcome, color in SERIES:
            n = outcomes.get(outcome, 0)
            if n:
                height = n / peak * (CHART_HEIGHT - 10)
                y -= height
                rects.append(charts.Bar(AXIS + i * slot + 1, y, slot - 2, height, color, f"{at:%H:%M} {outcome}: {n}"))
    return rects, max(totals, default=0)


def tool_bars(stats: dashboard.ToolStats) -> list[tuple[float, str, str]]:
    """(percent width, colour, label) segments of one tool's write calls."""
    if not stats.writes:
        return []
    return [(stats.count(o) / stats.writes * 100, color, f"{o}: {stats.count(o)}")
            for o, color in SERIES if stats.count(o)]


@admin.register(Dashboard)
class DashboardAdmin(ReadOnlyAdmin[Dashboard]):
    def get_urls(self) -> list[URLPattern]:
        # The dashboard page only: no change or history pages of single call events (they are not tenant-scoped).
        return [path("", self.admin_site.admin_view(self.changelist_view),
                     name=f"{self.opts.app_label}_{self.opts.model_name}_changelist")]

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> TemplateResponse:
        if not self.has_view_permission(request):
            raise DjangoPermissionDenied
        window = request.GET.get("window", "hour")
        tenants = list(access.scope(Tenant.objects.all(), request.user, "id"))
        tenant = next((t for t in tenants if str(t.pk) == request.GET.get("tenant")), None)
        tools = sorted(spec.name for spec in registry.all_tools())
        tool = request.GET.get("tool") if request.GET.get("tool") in tools else None
        # What the dashboard shows decides nothing (the queues it counts are acted on in their own pages):
        # it reads a replica when there is one.
        with replicas.reading():
            snap = dashboard.snapshot(request.user, window)
            trend = trends.trend(request.user, snap.window.name, now=snap.now,
                                 tenant_id=tenant.pk if tenant else None, tool=tool)
        rects, peak = timeline_rects(snap)
        context = {
            **self.admin_site.each_context(request),
            "title": f"Dashboard: the last {snap.window.name}",
            "tenants": tenants, "tenant": tenant, "tools": tools, "tool": tool,
            "trend": trend, "trend_charts": charts.seed_charts(trend),
            "opts": self.opts,
            "snapshot": snap,
            "rows": [(s, tool_bars(s), age(s.oldest_waiting) if s.oldest_waiting else "—") for s in snap.tools],
            "rects": rects, "peak": peak, "series": SERIES,
            "chart_width": CHART_WIDTH, "chart_height": CHART_HEIGHT, "axis": AXIS,
            "windows": list(dashboard.WINDOWS), "window": snap.window.name,
            "approvals_waiting": sum(s.approvals_waiting for s in snap.tools),
            "unknown_total": sum(s.unknown for s in snap.tools),
            "overrun_total": sum(s.overrun_leases for s in snap.tools),
            "oldest_pending": age(snap.now - snap.oldest_pending_age) if snap.oldest_pending_age else "—",
        }
        return TemplateResponse(request, "admin/tools_app/dashboard.html", context)
