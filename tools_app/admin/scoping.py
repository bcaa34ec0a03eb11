"""Tenant scoping and read-only evidence, for every admin page that shows tenant data.

A superuser sees every tenant; anyone else only the tenants granted to them
by TenantAccess (access.scope). Scoping the queryset also scopes the change
pages and actions, which look objects up through it; a form's tenant field
offers only those tenants.
"""

from __future__ import annotations

from typing import Any

from django.contrib.admin.views.main import ChangeList
from django.db.models import ForeignKey, QuerySet
from django.forms import ModelChoiceField
from django.http import HttpRequest

from tools_app import access
from tools_app.access.models import Tenant
from tools_app.admin.generic import ModelAdmin, ModelT
from tools_app.core import replicas


class TenantScopedAdmin(ModelAdmin[ModelT]):
    """Mixin for ModelAdmins of models with a tenant (put it before the ModelAdmin base)."""

    tenant_field = "tenant_id"  # the lookup path to the tenant id, e.g. "request__tenant_id"

    def get_queryset(self, request: HttpRequest) -> QuerySet[ModelT]:
        return access.scope(super().get_queryset(request), request.user, self.tenant_field)

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


class ReplicaChangeList(ChangeList):
    """A list page's rows, date drill-down and counts read from a replica (tools_app/core/replicas.py)."""

    def get_results(self, request: HttpRequest) -> None:
        # Only what the page shows. `root_queryset`, through which the page's actions find the rows they
        # act on, stays on the primary.
        self.queryset = self.queryset.using(replicas.alias())
        super().get_results(request)


class ListedFromReplica(ModelAdmin[ModelT]):
    """Mixin for the evidence lists (records, audit events, tasks...): shown, never decided on, so read
    from a replica when there is one. Queues an operator acts on are not listed this way; change pages
    and actions read the primary."""

    # The unfiltered total would be a second count, of the whole table, on the primary.
    show_full_result_count = False

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return ReplicaChangeList
