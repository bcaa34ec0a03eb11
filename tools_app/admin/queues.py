"""What makes a queue page a work queue: its summary on the console's home (count, oldest, what
stands out), the rows that stand out, and the page refreshing itself with its filters.

Refreshing: the page polls `<queue>/poll/` (htmx, every IDEMOPS_CONSOLE_REFRESH_SECONDS) with its
own query string (filters, search, ordering, page), the version of what it shows and when it was
drawn. The server builds the same change list and answers 204 when nothing changed, a full-page
refresh (htmx's HX-Refresh) when it changed and the operator is idle, and a notice when it
changed while the operator is busy (rows selected, an action chosen, typing): a refresh never
throws away a selection. The version covers every field of the rows on the page and the counts;
an idle page is also refreshed once it is a minute old, so the ages it shows stay current.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from django.contrib import admin
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.db.models import BooleanField, Count, ExpressionWrapper, Min, Q, QuerySet, Value
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html
from django.utils.text import capfirst
from django_htmx.http import HttpResponseClientRefresh

from tools_app.admin.generic import ModelAdmin, ModelT
from tools_app.conf import conf

# Query parameters of the poll that are not the change list's own.
VERSION, DRAWN, IDLE = "_version", "_drawn", "_idle"
# An idle page older than this is drawn again even if no row changed: its ages moved on.
AGES_REFRESH_SECONDS = 60


@dataclass(frozen=True)
class QueueSummary:
    """One queue as the console's home shows it."""

    name: str
    url: str
    count: int
    oldest: datetime | None
    stands_out: int
    stands_out_label: str
    what_to_do: str

    @property
    def hint(self) -> str:
        """The first sentence of what to do, for the home page's card."""
        return self.what_to_do.split(". ")[0].rstrip(".") + "." if self.what_to_do else ""


class LiveQueue(ModelAdmin[ModelT]):
    """Mixin for a queue's ModelAdmin (QueueAdmin): summary, standing out, refreshing itself."""

    age_field = "created_at"  # the queue's "oldest" is the smallest value of this field
    stands_out_label = ""  # e.g. "escalated": rows matching `standing_out()` are flagged and highlighted
    what_to_do = ""  # one paragraph for a new operator: what the rows are and how to settle them
    change_list_template = "admin/tools_app/queue_change_list.html"

    def standing_out(self) -> Q | None:
        """The rows that need attention first (None: none do)."""
        return None

    def get_queryset(self, request: HttpRequest) -> QuerySet[ModelT]:
        queryset = super().get_queryset(request)
        flagged = self.standing_out()
        # The same rows with one more attribute: the plugin cannot say so of a model that is a type variable.
        stands_out = ExpressionWrapper(flagged if flagged is not None else Value(False), output_field=BooleanField())
        return cast(QuerySet[ModelT], queryset.annotate(stands_out=stands_out))

    @admin.display(description="", empty_value="")
    def flag(self, obj: ModelT) -> str:
        if not getattr(obj, "stands_out", False):
            return ""
        return format_html('<span class="stands-out">{}</span>', self.stands_out_label)

    def summary(self, request: HttpRequest) -> QueueSummary:
        flagged = self.standing_out()
        figures = self.get_queryset(request).aggregate(
            count=Count("pk"), oldest=Min(self.age_field),
            **({"stands_out": Count("pk", filter=flagged)} if flagged is not None else {}))
        return QueueSummary(name=str(capfirst(self.opts.verbose_name_plural)),
                            url=reverse(f"admin:{self.opts.app_label}_{self.opts.model_name}_changelist"),
                            count=figures["count"], oldest=figures["oldest"], stands_out=figures.get("stands_out", 0),
                            stands_out_label=self.stands_out_label, what_to_do=self.what_to_do)

    # --- refreshing ----------------------------------------------------------------------------

    def get_urls(self) -> list[URLPattern]:
        return [path("poll/", self.admin_site.admin_view(self.poll_view),
                     name=f"{self.opts.app_label}_{self.opts.model_name}_poll")] + super().get_urls()

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        response = super().changelist_view(request, {
            "what_to_do": self.what_to_do, "refresh_seconds": conf().console_refresh_seconds,
            "poll_url": reverse(f"admin:{self.opts.app_label}_{self.opts.model_name}_poll"),
            **(extra_context or {})})
        context = getattr(response, "context_data", None)
        if context and "cl" in context:  # a list page (not a redirect, nor an action's confirmation form)
            query = request.GET.copy()
            query[VERSION], query[DRAWN] = version(context["cl"]), str(int(time.time()))
            context["poll_query"] = query.urlencode()
        return response

    def poll_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_or_change_permission(request):
            raise DjangoPermissionDenied
        seen, idle = request.GET.get(VERSION, ""), request.GET.get(IDLE) == "1"
        try:
            drawn = int(request.GET.get(DRAWN, "0"))
        except ValueError:
            drawn = 0
        query = request.GET.copy()
        for name in (VERSION, DRAWN, IDLE):
            query.pop(name, None)
        # The change list reads its filters from request.GET: without the poll's own parameters.
        # (The stubs declare request.GET read-only; Django lets a view replace it.)
        request.GET = query  # type: ignore[assignment]
        try:
            changelist = self.get_changelist_instance(request)
        except IncorrectLookupParameters:
            return HttpResponse(status=204)  # the page itself shows that error
        if version(changelist) == seen:
            aged = time.time() - drawn >= AGES_REFRESH_SECONDS
            return HttpResponseClientRefresh() if idle and aged else HttpResponse(status=204)
        if idle:
            return HttpResponseClientRefresh()
        return TemplateResponse(request, "admin/tools_app/queue_changed.html", {
            "count": changelist.result_count, "reload_url": f"?{request.GET.urlencode()}"})


def version(changelist: ChangeList) -> str:
    """What a queue page shows, as a short digest: its rows (every field, and whether each stands out)
    and how many match its filters (rows its filters leave out do not count)."""
    fields = changelist.model._meta.concrete_fields
    rows = [(*(getattr(obj, f.attname) for f in fields), getattr(obj, "stands_out", False))
            for obj in changelist.result_list]
    shown: Any = (changelist.result_count, rows)
    return hashlib.sha256(repr(shown).encode()).hexdigest()[:16]
