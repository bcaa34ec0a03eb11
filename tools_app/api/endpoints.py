"""What every auditors' endpoint shares; an endpoint only declares what differs.

A new endpoint is a serializer deriving from AuditorSerializer (its fields
are the columns, in order), a filterset and

    class TaskViewSet(AuditorViewSet):
        queryset = Task.objects.select_related("tenant")
        serializer_class = TaskSerializer
        filterset_class = TaskFilter
        export_name = "tasks"

registered in tools_app/api/urls.py. From this base it gets: auditor key or
session auth, tenant scoping (`tenant_field`; another tenant's row is 404),
django-filter filters, ordering by time, cursor pages, a streamed CSV of the
filtered list at `<prefix>/export.csv`, and its errors in the OpenAPI schema.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import django_filters
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import QuerySet
from django.http import StreamingHttpResponse
from django_filters.fields import IsoDateTimeField
from django_filters.rest_framework import DjangoFilterBackend
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers, viewsets
from rest_framework.authentication import SessionAuthentication
from rest_framework.decorators import action
from rest_framework.filters import OrderingFilter
from rest_framework.generics import GenericAPIView
from rest_framework.pagination import CursorPagination
from rest_framework.renderers import BaseRenderer, BrowsableAPIRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.views import APIView

from tools_app import access
from tools_app.access import auditors
from tools_app.api import csv_export
from tools_app.api.auth import AuditorKeyAuthentication, IsAuditor
from tools_app.core import replicas

# --- pages and order ------------------------------------------------------------


class TimeCursorPagination(CursorPagination):
    """Cursor pages: stable under concurrent inserts, no COUNT(*), no deep OFFSET."""

    page_size = 100
    page_size_query_param = "page_size"
    page_size_query_description = "Rows per page (1-1000, default 100)."
    max_page_size = 1000
    ordering = ("-created_at", "-id")


class TimeOrdering(OrderingFilter):
    """`?ordering=created_at` (oldest first) or `-created_at` (newest first, the default).

    One field only, with the id as a tie-breaker in the same direction, so
    rows that share a timestamp still come in one fixed order and no row is
    on two pages.
    """

    def get_ordering(self, request: Request, queryset: QuerySet[Any], view: APIView) -> Sequence[str] | None:
        ordering = super().get_ordering(request, queryset, view)
        if not ordering:  # a view without a default ordering: nothing to break ties in
            return ordering
        first = ordering[0]
        if first.lstrip("-") == "id":
            return (first,)
        return (first, "-id" if first.startswith("-") else "id")

    def get_schema_operation_parameters(self, view: APIView) -> list[dict[str, Any]]:
        assert isinstance(view, AuditorViewSet)  # the only views ordered by time
        choices = [choice for field in view.ordering_fields for choice in (field, f"-{field}")]
        description = (f"Sort order: a field for ascending, `-field` for descending; default `{view.ordering[0]}`. "
                       "Rows with equal values come in id order.")
        return [{
            "name": self.ordering_param, "required": False, "in": "query",
            "description": description,
            "schema": {"type": "string", "enum": choices, "default": view.ordering[0]},
        }]


# --- filters every endpoint uses ----------------------------------------------------


def tenant_filter(field_name: str = "tenant__slug") -> django_filters.CharFilter:
    return django_filters.CharFilter(
        field_name=field_name,
        help_text="Tenant slug. Only tenants granted to you ever match: another tenant's slug returns no rows.")


# django-filter ships no types, so its classes are Any to the checker.
class UtcIsoDateTimeField(IsoDateTimeField):  # type: ignore[misc]
    """An ISO 8601 time, converted to UTC: PostgreSQL refuses UTC offsets beyond
    ±15:59 that Python accepts, and a time near year 1 or 9999 may not convert."""

    def to_python(self, value: Any) -> datetime | None:
        moment: datetime | None = super().to_python(value)
        if moment is None:
            return None
        try:
            return moment.astimezone(UTC)
        except OverflowError:
            raise ValidationError("time out of range once converted to UTC", code="invalid") from None


class UtcIsoDateTimeFilter(django_filters.IsoDateTimeFilter):  # type: ignore[misc]  # django-filter: no types
    field_class = UtcIsoDateTimeField


def time_range(field_name: str, what: str) -> tuple[UtcIsoDateTimeFilter, UtcIsoDateTimeFilter]:
    """`<x>_after` (inclusive) and `<x>_before` (exclusive), so ranges tile without overlap."""
    return (
        UtcIsoDateTimeFilter(
            field_name=field_name, lookup_expr="gte",
            help_text=f"Only rows {what} at or after this ISO 8601 time (inclusive)."),
        UtcIsoDateTimeFilter(
            field_name=field_name, lookup_expr="lt",
            help_text=f"Only rows {what} strictly before this ISO 8601 time (exclusive)."),
    )


# --- serializers -------------------------------------------------------------------------


class UtcDateTimeField(serializers.DateTimeField):
    """ISO 8601 in UTC with a `Z`, as DRF writes it here, without DRF's per-value
    time zone lookup: it was half the serializing time of a CSV export."""

    # DRF's stub says datetime -> str; this one also answers a missing time with None.
    def to_representation(self, value: datetime | None) -> str | None:  # type: ignore[override]
        if not value:
            return None
        return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


class AuditorSerializer(serializers.ModelSerializer[models.Model]):
    """Base of every endpoint's serializer: read-only, times in UTC."""

    serializer_field_mapping = {**serializers.ModelSerializer.serializer_field_mapping,
                                models.DateTimeField: UtcDateTimeField}


# --- errors, as the schema shows them -------------------------------------------------


class ErrorSerializer(serializers.Serializer[dict[str, str]]):
    detail = serializers.CharField(help_text="What went wrong.")


ERROR_RESPONSES = {
    401: OpenApiResponse(ErrorSerializer, description="No credentials, or an unknown or revoked auditor key."),
    403: OpenApiResponse(ErrorSerializer, description="Logged in without the auditor permission."),
    404: OpenApiResponse(ErrorSerializer, description="No such row among the tenants you may see, "
                                                      "or an invalid cursor."),
}
FILTER_ERROR_RESPONSE = {
    400: OpenApiResponse(OpenApiTypes.OBJECT, description="A filter parameter is invalid; the body names it. "
                         "Shape: `{\"<parameter>\": [\"<message>\", ...]}`."),
}


class AuditorSchema(AutoSchema):
    """Filters on the CSV export too, and the error answers on every operation."""

    def get_filter_backends(self) -> list[Any]:
        if getattr(self.view, "action", None) in ("list", "export") and isinstance(self.view, GenericAPIView):
            return list(self.view.filter_backends)
        return super().get_filter_backends()

    # drf-spectacular annotates one serializer, but also takes a dict of them by status (as extend_schema's
    # `responses` does).
    def get_response_serializers(self) -> dict[Any, Any]:  # type: ignore[override]
        declared: Any = super().get_response_serializers()
        responses = declared if isinstance(declared, dict) else {200: declared}
        extra = dict(ERROR_RESPONSES)
        if getattr(self.view, "action", None) in ("list", "export"):
            extra.update(FILTER_ERROR_RESPONSE)
        return {**responses, **extra}

    def _resolve_path_parameters(self, variables: list[str]) -> list[dict[str, Any]]:
        # The id's type comes from the model (integer or UUID); what it means is the same everywhere.
        parameters: list[dict[str, Any]] = super()._resolve_path_parameters(  # type: ignore[no-untyped-call]
            variables)  # drf-spectacular leaves this one unannotated
        for parameter in parameters:
            if parameter["name"] == "id" and not parameter.get("description"):
                parameter["description"] = ("The row's id. A row of a tenant you may not see answers 404, "
                                            "like one that does not exist.")
        return parameters

    def get_operation_id(self) -> str:
        if getattr(self.view, "action", None) == "export" and isinstance(self.view, AuditorViewSet):
            return f"{self.view.export_name.replace('-', '_')}_export_csv"
        return super().get_operation_id()


# --- CSV --------------------------------------------------------------------------------


class CSVRenderer(BaseRenderer):
    """Lets `Accept: text/csv` through content negotiation; renders the export's errors."""

    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(self, data: Any, accepted_media_type: str | None = None,
               renderer_context: Mapping[str, Any] | None = None) -> bytes:
        if not isinstance(data, dict):
            data = {"detail": data}
        return b"".join(csv_export.csv_chunks(list(data), [list(data.values())]))


# --- the base viewset -------------------------------------------------------------------


class AuditorViewSet(viewsets.ReadOnlyModelViewSet[models.Model]):
    """Read-only, tenant-scoped, filterable, paginated and exportable.

    Subclasses set `queryset`, `serializer_class`, `filterset_class`,
    `export_name`, and `tenant_field` when the tenant is reached through a
    relation (e.g. `"task__tenant_id"` for checkpoints). `csv_fields` narrows
    the CSV columns (default: every serializer field, in declared order).
    """

    tenant_field = "tenant_id"
    # Any segment reaches the view, so a malformed id is DRF's JSON 404, not Django's HTML one.
    lookup_value_regex = "[^/]+"
    export_name = ""
    csv_fields: list[str] | None = None

    authentication_classes = [AuditorKeyAuthentication, SessionAuthentication]
    permission_classes = [IsAuditor]
    renderer_classes = [JSONRenderer, BrowsableAPIRenderer]
    filter_backends = [DjangoFilterBackend, TimeOrdering]
    pagination_class = TimeCursorPagination
    ordering_fields = ["created_at"]
    ordering = ["-created_at"]
    schema = AuditorSchema()

    def get_queryset(self) -> QuerySet[models.Model]:
        # Scoping is part of the queryset itself, so a detail view of another
        # tenant's row is a 404 and no filter or export can reach past it. Auditors only read: their
        # pages and exports come from a replica when there is one (the key that lets them in, and the
        # audit event of an export, are the primary's).
        return access.scope(super().get_queryset(), self.request.user, self.tenant_field).using(replicas.alias())

    def get_csv_fields(self) -> list[str]:
        if self.csv_fields:
            return self.csv_fields
        serializer = self.get_serializer()
        assert isinstance(serializer, serializers.Serializer)  # an AuditorSerializer
        return list(serializer.fields)

    @extend_schema(
        summary="Export the filtered list as CSV",
        description="Every row matching the filters, in the requested order, streamed as CSV (UTF-8, CRLF, "
                    "a header row first, columns in the order of the JSON fields). Lists are joined by `;`, "
                    "objects are JSON; a text cell starting with `= + - @` is prefixed with `'` so that "
                    "spreadsheets do not run it. Not paginated. Each export is recorded in the audit log.",
        responses={(200, "text/csv"): OpenApiResponse(OpenApiTypes.STR, description="The CSV file."),
                   **ERROR_RESPONSES, **FILTER_ERROR_RESPONSE},
        # The renderers exist for content negotiation (Accept: text/csv), not as a choice.
        parameters=[OpenApiParameter("format", exclude=True)],
    )
    @action(detail=False, url_path="export.csv", renderer_classes=[JSONRenderer, CSVRenderer],
            pagination_class=None)
    def export(self, request: Request, *args: Any, **kwargs: Any) -> StreamingHttpResponse:
        queryset = self.filter_queryset(self.get_queryset())
        columns = self.get_csv_fields()
        serializer = self.get_serializer()
        auditors.record_export(request.user, self.export_name, _filters_of(request))
        rows = (_row(serializer.to_representation(obj), columns)
                for obj in queryset.iterator(chunk_size=csv_export.ROWS_PER_FETCH))
        return csv_export.streaming_csv_response(request._request, columns, rows, f"{self.export_name}.csv")


def _row(data: dict[str, Any], columns: list[str]) -> list[Any]:
    return [data.get(column) for column in columns]


def _filters_of(request: Request) -> dict[str, str]:
    return {name: ",".join(request.query_params.getlist(name)) for name in sorted(request.query_params)}
