"""Scheduled operations in the admin: list them (next tick, paused, latest occurrences), schedule a
tool call, pause and resume.

Scheduling, pausing and resuming go through tools_app.scheduling, which checks the manage_schedules
permission, the tenant and the second factor itself (access.authorize) and audits the change.
"""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.contrib import admin
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import ValidationError
from django.http import HttpRequest

from tools_app import scheduling
from tools_app.access.models import Tenant
from tools_app.admin.generic import ModelAdmin, TabularInline
from tools_app.admin.operator_actions import REASON_OPTIONAL, OperatorAction, OperatorActionsAdmin
from tools_app.admin.scoping import TenantScopedAdmin
from tools_app.core.errors import PermissionDenied, ToolFailure
from tools_app.scheduling.models import ScheduledOperation, ScheduledRun
from tools_app.scheduling.operations import check_arguments
from tools_app.toolkit.registry import all_tools


def pause(request: HttpRequest, row: ScheduledOperation, reason: str) -> str:
    scheduling.pause(row, request.user, reason=reason)
    return "paused: no occurrence comes due until it is resumed"


def resume(request: HttpRequest, row: ScheduledOperation, reason: str) -> str:
    row = scheduling.resume(row, request.user, reason=reason)
    return f"resumed; next tick {row.next_tick_at:%Y-%m-%d %H:%M:%S} UTC" if row.next_tick_at else "resumed"


class RunInline(TabularInline[ScheduledRun, ScheduledOperation]):
    model = ScheduledRun
    extra = 0
    can_delete = False
    max_num = 0
    verbose_name_plural = "occurrences (newest first)"
    fields = readonly_fields = ("tick_at", "key", "status", "outcome", "error_class", "operation_id", "started_at",
                                "finished_at")

    def has_change_permission(self, request: HttpRequest, obj: ScheduledOperation | None = None) -> bool:
        return False


# django-stubs makes ModelForm generic over its model; the admin's forms name it in Meta instead.
class ScheduleForm(forms.ModelForm):  # type: ignore[type-arg]
    tool = forms.ChoiceField(choices=())
    arguments = forms.JSONField(initial=dict, help_text="The call's arguments, without idempotency_key.")

    class Meta:
        model = ScheduledOperation
        fields = ["tenant", "tool", "arguments", "cron", "run_at", "overlap", "backfill"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        tool = self.fields["tool"]
        assert isinstance(tool, forms.ChoiceField)
        tool.choices = sorted((spec.name, spec.name) for spec in all_tools()
                                             if spec.writes and not spec.requires_operation_id)

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if not self.errors:
            try:
                check_arguments(ScheduledOperation(**{name: data.get(name) for name in self.Meta.fields
                                                      if name != "tenant"}))
            except ToolFailure as refused:
                raise ValidationError(refused.message) from None
        return data


@admin.register(ScheduledOperation)
class ScheduledOperationAdmin(OperatorActionsAdmin[ScheduledOperation], TenantScopedAdmin[ScheduledOperation],
                              ModelAdmin[ScheduledOperation]):
    """Every scheduled operation of the tenants this operator sees."""

    form = ScheduleForm
    inlines = [RunInline]
    list_display = ["id", "tenant", "tool", "rule", "overlap", "backfill", "paused", "next_tick_at", "created_by"]
    list_filter = ["paused", "overlap"]
    operator_actions = [
        OperatorAction("pause", "Pause", scheduling.PAUSE, pause, refused=(ToolFailure,), reason=REASON_OPTIONAL),
        OperatorAction("resume", "Resume", scheduling.RESUME, resume, refused=(ToolFailure,),
                       reason=REASON_OPTIONAL),
    ]

    @admin.display(description="rule")
    def rule(self, row: ScheduledOperation) -> str:
        return f"cron {row.cron} (UTC)" if row.cron else f"once at {row.run_at:%Y-%m-%d %H:%M:%S %Z}"

    def get_readonly_fields(self, request: HttpRequest, obj: ScheduledOperation | None = None) -> list[str]:
        if obj is None:
            return []
        return ["tenant", "tool", "pretty_arguments", "cron", "run_at", "overlap", "backfill", "paused",
                "next_tick_at", "created_by", "created_at"]

    def get_fields(self, request: HttpRequest, obj: ScheduledOperation | None = None) -> Any:
        if obj is None:
            return list(ScheduleForm.Meta.fields)
        return self.get_readonly_fields(request, obj)

    @admin.display(description="arguments")
    def pretty_arguments(self, row: ScheduledOperation) -> str:
        return json.dumps(row.arguments, indent=2, sort_keys=True)

    def has_change_permission(self, request: HttpRequest, obj: ScheduledOperation | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: ScheduledOperation | None = None) -> bool:
        return False

    def has_add_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(scheduling.SCHEDULE.permission)

    def save_model(self, request: HttpRequest, obj: ScheduledOperation, form: Any, change: bool) -> None:
        """Scheduled by tools_app.scheduling (authorized, audited), not saved by the form."""
        tenant: Tenant = form.cleaned_data["tenant"]
        try:
            row = scheduling.schedule(request.user, tenant.pk, obj.tool, obj.arguments, cron=obj.cron,
                                      run_at=obj.run_at, overlap=obj.overlap, backfill=obj.backfill)
        except PermissionDenied as refused:
            raise DjangoPermissionDenied(refused.message) from None
        obj.pk, obj.created_by, obj.created_at, obj.next_tick_at = row.pk, row.created_by, row.created_at, \
            row.next_tick_at
