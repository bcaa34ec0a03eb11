"""Tenant scoping and read-only evidence, for every admin page that shows tenant data.

A superuser sees every tenant; anyone else only the tenants granted to them
by TenantAccess (access.scope). Scoping the queryset also scopes the change
pages and actions, which look objects up through it; a form's tenant field
offers only those tenants.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any
from urllib.parse import parse_qsl, urlencode

from django.contrib.admin import helpers
from django.contrib.admin.views.main import ChangeList
from django.core.paginator import Paginator
from django.db import connections
from django.db.models import ForeignKey, QuerySet
from django.forms import ModelChoiceField
from django.http import HttpRequest
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext

from tools_app import access
from tools_app.access.models import Tenant
from tools_app.admin.big_lists import exact_search
from tools_app.admin.generic import ModelAdmin, ModelT
from tools_app.core import personal, replicas


class TenantScopedAdmin(ModelAdmin[ModelT]):
    """Mixin for ModelAdmins of models with a tenant (put it before the ModelAdmin base)."""

    tenant_field = "tenant_id"  # the lookup path to the tenant id, e.g. "request__tenant_id"

    def get_queryset(self, request: HttpRequest) -> QuerySet[ModelT]:
        return access.scope(super().get_queryset(request), request.user, self.tenant_field)

    def get_object(self, request: HttpRequest, object_id: str, from_field: str | None = None) -> ModelT | None:
        """The object its page shows: its personal values `[personal]` to whoever may not see them
        (core.personal.masked; decrypted, `[forgotten]` or `[unreadable]` to the others)."""
        obj = super().get_object(request, object_id, from_field)
        if obj is not None and not request.user.has_perm(personal.VIEW_PERSONAL_VALUES):
            personal.masked(obj)
        return obj

    def formfield_for_foreignkey(self, db_field: ForeignKey[Any, Any], request: HttpRequest,
                                 **kwargs: Any) -> ModelChoiceField[Any] | None:
        if db_field.name == "tenant":  # a form names no tenant this user may not see
            kwargs["queryset"] = access.scope(Tenant.objects.all(), request.user, "pk")
        return super().formfield_for_foreignkey(db_field, request, **kwargs)


class ReadOnlyAdmin(ModelAdmin[ModelT]):
    """Evidence is shown, never edited: no add, change or delete, whoever asks."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: ModelT | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: ModelT | None = None) -> bool:
        return False


COUNT_AT_MOST = 10_000


class AtLeast(int):
    """A count that stopped counting at COUNT_AT_MOST: the page says 'more than 10,000'."""

    def __str__(self) -> str:
        return f"more than {COUNT_AT_MOST:,}"


class About(int):
    """The planner's estimate of a whole table's rows (pg_class.reltuples)."""

    def __str__(self) -> str:
        return f"about {int(self):,}"


class BoundedCountPaginator(Paginator):  # type: ignore[type-arg]  # not subscriptable at run time
    """Pages of a big table without a COUNT(*) over it. A list with no filter takes the planner's
    estimate of the table's rows once it is beyond COUNT_AT_MOST; a filtered list counts at most
    COUNT_AT_MOST + 1 rows (`SELECT count(*) FROM (... LIMIT 10001)`). Either costs at most that many
    rows read, however big the table grows; pages beyond are reached by narrowing the filters."""

    @cached_property
    def count(self) -> int:
        queryset = self.object_list
        assert isinstance(queryset, QuerySet)  # the admin pages querysets
        if not queryset.query.where:
            estimate = _estimated_rows(queryset)
            if estimate > COUNT_AT_MOST:
                return About(estimate)
        # Unordered: the rows counted need no order, and a sort of them would be read before the count.
        counted = queryset.order_by()[:COUNT_AT_MOST + 1].count()
        return AtLeast(counted) if counted > COUNT_AT_MOST else counted


def _estimated_rows(queryset: QuerySet[Any]) -> int:
    """The planner's estimate of the table's rows: of a partitioned table (the audit events), the sum of its
    partitions', which autovacuum keeps up to date (it never analyses a partitioned table itself)."""
    with connections[queryset.db].cursor() as cursor:
        cursor.execute("SELECT CASE WHEN c.relkind = 'p' THEN (SELECT sum(greatest(p.reltuples, 0)) "  # -1: never
                       "FROM pg_partition_tree(c.oid) t JOIN pg_class p ON p.oid = t.relid WHERE t.isleaf) "  # analysed
                       "ELSE greatest(c.reltuples, 0) END::bigint FROM pg_class c WHERE c.oid = %s::regclass",
                       [queryset.model._meta.db_table])
        row = cursor.fetchone()
    return int(row[0]) if row and row[0] is not None else 0


class ReplicaChangeList(ChangeList):
    """A list page's rows, date drill-down and counts read from a replica (tools_app/core/replicas.py)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # The rows' links keep the list's filters, as Django's do; built here once per page, not by Django's
        # template tag, which resolves each row's URL again to find whether it is the list's (a tenth of a
        # page of 100 rows). Empty, the tag leaves the links as url_for_result makes them.
        self.row_link_query = urlencode(dict(parse_qsl(self.preserved_filters)))
        self.preserved_filters = ""

    def url_for_result(self, result: Any) -> str:
        url = super().url_for_result(result)
        return f"{url}?{self.row_link_query}" if self.row_link_query else url

    def get_results(self, request: HttpRequest) -> None:
        # Only what the page shows. `root_queryset`, through which the page's actions find the rows they
        # act on, stays on the primary.
        self.queryset = self.queryset.using(replicas.alias())
        deferred = getattr(self.model_admin, "list_deferred", ())
        if deferred:
            self.queryset = self.queryset.defer(*deferred)
        super().get_results(request)


class ListedFromReplica(ModelAdmin[ModelT]):
    """Mixin for the evidence lists (records, audit events, tasks...), the big tables: shown, never decided
    on, so read from a replica when there is one, and paged without counting the table. Queues an operator
    acts on are not listed this way; change pages and actions read the primary."""

    # Columns the list does not show and would only decode per row (big JSON): not read for the list page.
    list_deferred: tuple[str, ...] = ()
    # The unfiltered total would be a second count, of the whole table, on the primary.
    show_full_result_count = False
    paginator = BoundedCountPaginator
    # Only orders an index serves with the tenant scoping (tests/admin/test_big_list_indexes.py).
    sortable_by = ["id", "created_at"]
    # No date_hierarchy: its drill-down lists the years and months of every row (a DISTINCT over the whole
    # table on each page); the from/to days (big_lists.DateRangeFilter) narrow by time instead.

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return ReplicaChangeList

    def action_checkbox(self, obj: ModelT) -> SafeString:
        """Django's row checkbox, the same HTML written directly: Django renders it through the form widget's
        template, which took a sixth of a page of 100 rows."""
        label = format_html(gettext("Select this object for an action - {}"), str(obj))
        return format_html('<input type="checkbox" name="{}" value="{}" class="action-select" aria-label="{}">',
                           helpers.ACTION_CHECKBOX_NAME, str(obj.pk), label)

    def get_search_results(self, request: HttpRequest, queryset: QuerySet[ModelT],
                           search_term: str) -> tuple[QuerySet[ModelT], bool]:
        """Exact values only (an id, a trace id, an actor), each found through its index."""
        if not search_term.strip():
            return queryset, False
        return exact_search(queryset, list(self.get_search_fields(request)), search_term), False
