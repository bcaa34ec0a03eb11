"""The filters of the big tables' list pages (records, audit events, tasks...), each served by an index with
the tenant scoping (the models' Meta.indexes; tests/admin/test_big_list_indexes.py reads the plans), and none
reading the whole table to draw its choices, as Django's AllValuesFieldListFilter and RelatedOnlyFieldListFilter
do (a SELECT DISTINCT over every row, on every page).

DateRangeFilter: two date inputs, from and to (both days included), on a time column. Django's
DateFieldListFilter offers fixed spans (today, past 7 days...); a big table needs any span, so an
operator narrows a list of millions of rows to the days an incident lasted. The filter takes its own
parameters (`<field>__gte`, `<field>__lte`, and `<field>__lt` as Django's own filter writes it), so a bad
value, typed or crafted, is refused with a message on the page instead of reaching the query."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import date, datetime, time, timedelta
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import ValidationError
from django.db import connection, connections
from django.db.models import AutoField, Field, IntegerField, Model, Q, QuerySet
from django.http import HttpRequest
from django.utils import timezone

from tools_app import access
from tools_app.access.models import Tenant

RECENT_ROWS = 10_000


class DateRangeForm(forms.Form):
    since = forms.DateField(required=False)
    until = forms.DateField(required=False)
    before = forms.DateField(required=False)

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        since, until = cleaned.get("since"), cleaned.get("until")
        if since and until and since > until:
            raise forms.ValidationError("the first day is after the last")
        return cleaned


def start_of(day: date) -> datetime:
    """Midnight at the start of `day` in the console's time zone: a day is the operator's day."""
    return timezone.make_aware(datetime.combine(day, time.min))


class DateRangeFilter(admin.FieldListFilter):
    template = "admin/tools_app/date_range_filter.html"

    def __init__(self, field: Field[Any, Any], request: HttpRequest, params: dict[str, list[str]],
                 model: type[Model], model_admin: admin.ModelAdmin[Any], field_path: str) -> None:
        self.since_param, self.until_param = f"{field_path}__gte", f"{field_path}__lte"
        self.before_param = f"{field_path}__lt"
        super().__init__(field, request, params, model, model_admin, field_path)
        self.title = f"{getattr(field, 'verbose_name', field_path)} (from / to)"
        self.form = DateRangeForm(data={
            "since": self._value(self.since_param), "until": self._value(self.until_param),
            "before": self._value(self.before_param)})

    def _value(self, param: str) -> str:
        values = self.used_parameters.get(param) or [""]
        return str(values[-1] if isinstance(values, list) else values)

    def expected_parameters(self) -> list[str | None]:
        return [self.since_param, self.until_param, self.before_param]

    def has_output(self) -> bool:
        return True

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if not self.used_parameters:
            return queryset
        if not self.form.is_valid():
            problems = "; ".join(f"{value}" for errors in self.form.errors.values() for value in errors)
            messages.error(request, f"Filter “{self.title}” not applied: {problems} (a day is YYYY-MM-DD).")
            return queryset
        since, until, before = (self.form.cleaned_data[name] for name in ("since", "until", "before"))
        # Half-open ranges of times [start of first day, start of the day after the last) so that the
        # column's index serves them as a range scan.
        if since:
            queryset = queryset.filter(**{f"{self.field_path}__gte": start_of(since)})
        if until:
            queryset = queryset.filter(**{f"{self.field_path}__lt": start_of(until + timedelta(days=1))})
        if before:
            queryset = queryset.filter(**{f"{self.field_path}__lt": start_of(before)})
        return queryset

    def choices(self, changelist: ChangeList) -> Iterator[Any]:
        kept = [(name, value) for name, values in changelist.params.items()
                if name not in self.expected_parameters() for value in values]
        yield {
            "field_path": self.field_path, "since_param": self.since_param, "until_param": self.until_param,
            "since": self._value(self.since_param), "until": self._value(self.until_param), "kept": kept,
            "clear_url": changelist.get_query_string(remove=[self.since_param, self.until_param, self.before_param]),
            "selected": bool(self.used_parameters),
        }


class TenantFilter(admin.RelatedFieldListFilter):
    """The tenants the person may see, from the grants: not from the rows, which would be a scan of them."""

    def field_choices(self, field: Any, request: HttpRequest, model_admin: admin.ModelAdmin[Any]) -> list[Any]:
        tenants = access.scope(Tenant.objects.order_by("slug"), request.user, "pk")
        return [(tenant.pk, str(tenant)) for tenant in tenants]


class RecentValuesFilter(admin.AllValuesFieldListFilter):
    """The values of a free-text column (tool, action...) found among the newest RECENT_ROWS rows the person
    may see: bounded, however big the table grows. An older value is still filtered on when given."""

    def __init__(self, field: Field[Any, Any], request: HttpRequest, params: dict[str, list[str]],
                 model: type[Model], model_admin: admin.ModelAdmin[Any], field_path: str) -> None:
        super().__init__(field, request, params, model, model_admin, field_path)
        newest = model_admin.get_queryset(request).order_by("-pk").values_list(field_path)[:RECENT_ROWS]
        sql, sql_params = newest.query.sql_with_params()
        # One read of the newest rows through the primary key, their few distinct values counted over that read
        # only (a join back to the table would have PostgreSQL hash the whole table's rows on a big one).
        with connections[newest.db].cursor() as cursor:
            cursor.execute(f"SELECT DISTINCT * FROM ({sql}) AS newest ORDER BY 1", sql_params)
            # The template iterates a list as well as a queryset.
            self.lookup_choices = [row[0] for row in cursor.fetchall() if row[0] is not None]  # type: ignore[assignment]


def exact_search(queryset: QuerySet[Any], field_names: list[str], search_term: str) -> QuerySet[Any]:
    """Rows whose value of one of `field_names` is one of the words of `search_term`, exactly: what an index
    on each field serves. Django's own search compares `UPPER(field::text)` or `LIKE '%...%'`, which no
    index serves: on a big table every search would read every row. A word that is no valid value of a
    field (not a UUID, a number out of range) is skipped for that field instead of erring."""
    opts = queryset.model._meta
    matches = Q()
    for word in search_term.split():
        for name in field_names:
            field = opts.get_field(name.lstrip("="))
            try:
                value = field.to_python(word)
                field.run_validators(value)
                field.get_db_prep_value(value, connection)
            except (ValidationError, ValueError, TypeError, OverflowError):
                continue
            if isinstance(field, (IntegerField, AutoField)) and not -2**63 <= value < 2**63:
                continue
            matches |= Q(**{field.attname: value})
    return queryset.filter(matches) if matches else queryset.none()
