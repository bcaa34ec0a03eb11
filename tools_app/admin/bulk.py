"""The "Bulk actions" pages: select by filter, see the count (a dry run), confirm one action, watch its
progress, stop it.

Thin: the form is parsed here; tools_app.bulk counts, checks (the bulk permission and the action's own,
the second factor, step-up for money tools; each refusal audited), freezes the selection, audits and
queues the batches. A crafted POST without the permission or second factor is answered 403, nothing
changes. docs/runbook.md#bulk-recovery.
"""

from __future__ import annotations

from typing import Any, cast
from urllib.parse import urlencode

from django import forms
from django.contrib import admin, messages
from django.contrib.auth.models import AnonymousUser, User
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse

from tools_app import access, bulk
from tools_app.access.models import Tenant
from tools_app.access.second_factor import StaleSecondFactor, verified
from tools_app.admin.find import tool_choices
from tools_app.admin.operator_actions import age, second_factor_page
from tools_app.admin.scoping import ReadOnlyAdmin
from tools_app.core import audit
from tools_app.core.errors import ErrorClass, InvalidInput, PermissionDenied
from tools_app.incidents.models import PauseScope
from tools_app.toolkit import pause_targets


def parse_attribute(text: str) -> tuple[str, str]:
    """`name=value` -> (name, value); a clear error otherwise."""
    name, sep, value = text.partition("=")
    name, value = name.strip(), value.strip()
    if not sep or not name or not value:
        raise forms.ValidationError("write it as name=value, e.g. order_id=42")
    if name not in bulk.search_field_names():
        raise forms.ValidationError(f"no tool declares the search field {name!r}; declared: "
                                    f"{', '.join(bulk.search_field_names()) or 'none'}")
    return name, value


class FilterForm(forms.Form):
    target = forms.ChoiceField(choices=bulk.Target.choices, label="Queue")
    tool = forms.ChoiceField(required=False)
    downstream = forms.ChoiceField(required=False, label="Downstream system")
    # Not `error_class`: a form's error_class is its error list's class.
    failure = forms.ChoiceField(required=False, choices=[("", "any")] + list(ErrorClass.choices),
                                label="Error class")
    created_after = forms.DateTimeField(required=False, help_text="e.g. 2026-12-01 10:00 (the server's time zone)")
    created_before = forms.DateTimeField(required=False)
    tenant = forms.ModelChoiceField(queryset=Tenant.objects.none(), required=False, empty_label="any tenant",
                                    to_field_name="slug")
    attribute = forms.CharField(required=False, max_length=300, label="Business attribute",
                                help_text="name=value, one of the tools' search fields, e.g. order_id=42")

    def __init__(self, *args: Any, user: User | AnonymousUser, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        cast("forms.ModelChoiceField[Tenant]", self.fields["tenant"]).queryset = access.scope(
            Tenant.objects.all(), user, "id")
        cast(forms.ChoiceField, self.fields["tool"]).choices = tool_choices()
        cast(forms.ChoiceField, self.fields["downstream"]).choices = [("", "any")] + [
            (name, name) for name in pause_targets.names(PauseScope.DOWNSTREAM)]

    def clean_attribute(self) -> str:
        text: str = self.cleaned_data["attribute"]
        if text.strip():
            parse_attribute(text)
        return text

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        after, before = data.get("created_after"), data.get("created_before")
        if after and before and after >= before:
            self.add_error("created_before", "must be after 'created after'")
        if data.get("failure") and data.get("target") == bulk.Target.DEAD_LETTERS:
            self.add_error("failure", "dead-lettered events have no error class")
        return data

    def filter(self) -> bulk.Filter:
        data = self.cleaned_data
        attribute = data["attribute"].strip()
        tenant = data["tenant"]
        return bulk.Filter(target=data["target"], tool=data["tool"], downstream=data["downstream"],
                           error_class=data["failure"], created_after=data["created_after"],
                           created_before=data["created_before"], tenant=tenant.slug if tenant else "",
                           attributes=dict([parse_attribute(attribute)]) if attribute else {})


class ConfirmForm(forms.Form):
    action = forms.ChoiceField()
    reason = forms.CharField(widget=forms.Textarea(attrs={"rows": 3, "cols": 60}), required=False, max_length=2000,
                             help_text="Kept on the bulk action, in its audit events and (resolve) as the evidence "
                                       "of every record: what you checked.")

    def __init__(self, *args: Any, target: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        cast(forms.ChoiceField, self.fields["action"]).choices = [
            (action.name, action.label) for action in bulk.actions_for(target)]


@admin.register(bulk.BulkAction)
class BulkActionAdmin(ReadOnlyAdmin[bulk.BulkAction]):
    change_list_template = "admin/tools_app/bulk_list.html"
    list_display = ["id", "action", "target", "state", "total", "done", "failed", "actor", "started"]
    list_filter = ["state", "action"]
    ordering = ["-created_at"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[bulk.BulkAction]:
        return bulk.visible(super().get_queryset(request), request.user)

    @admin.display(description="started", ordering="created_at")
    def started(self, obj: bulk.BulkAction) -> str:
        return f"{age(obj.created_at)} ago"

    def get_urls(self) -> list[URLPattern]:
        return [
            path("new/", self.admin_site.admin_view(self.new_view), name="tools_app_bulkaction_new"),
            path("<int:bulk_id>/progress/", self.admin_site.admin_view(self.progress_view),
                 name="tools_app_bulkaction_progress"),
            path("<int:bulk_id>/stop/", self.admin_site.admin_view(self.stop_view), name="tools_app_bulkaction_stop"),
        ] + super().get_urls()

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "",
                    extra_context: dict[str, Any] | None = None) -> HttpResponse:
        if not object_id.isdigit():
            raise Http404
        return HttpResponseRedirect(reverse("admin:tools_app_bulkaction_progress", args=[int(object_id)]))

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        return super().changelist_view(request, {
            "title": "Bulk actions", "may_run": request.user.has_perm(bulk.RUN_PERMISSION),
            "new_url": reverse("admin:tools_app_bulkaction_new"), **(extra_context or {})})

    # --- select, count, confirm ------------------------------------------------------------------------

    def new_view(self, request: HttpRequest) -> HttpResponse:
        if not request.user.has_perm(bulk.RUN_PERMISSION):
            refusal = f"missing permission: you do not have the permission to {bulk.RUN.what}"
            access.audit_refusal(bulk.RUN, bulk.BulkAction, audit.user_actor(request.user), refusal)
            raise DjangoPermissionDenied(refusal)
        if request.method != "POST" and not verified(request.user):
            return HttpResponseRedirect(second_factor_page(request.get_full_path()))
        data = request.POST if request.method == "POST" else (request.GET or None)
        form = FilterForm(data, user=request.user)
        matched: int | None = None
        confirm: ConfirmForm | None = None
        if form.is_bound and form.is_valid():
            flt = form.filter()
            try:
                matched = bulk.count(flt, request.user)
            except InvalidInput as invalid:
                form.add_error(None, invalid.message)
            else:
                confirm = ConfirmForm(request.POST if "confirm" in request.POST else None, target=flt.target)
                started = self._start(request, flt, confirm) if confirm.is_bound and confirm.is_valid() else None
                if started is not None:
                    return started
        return TemplateResponse(request, "admin/tools_app/bulk_new.html", {
            **self.admin_site.each_context(request), "title": "Bulk action: select, count, confirm",
            "opts": self.opts, "form": form, "matched": matched, "confirm": confirm,
            "actions": bulk.actions_for(form.cleaned_data["target"]) if matched else [],
            "changelist_url": reverse("admin:tools_app_bulkaction_changelist")})

    def _start(self, request: HttpRequest, flt: bulk.Filter, confirm: ConfirmForm) -> HttpResponse | None:
        """Start the confirmed bulk action: the redirect to its progress (or to a fresh second factor), or None
        with the refusal added to `confirm`."""
        try:
            started = bulk.start(request.user, flt, confirm.cleaned_data["action"],
                                 reason=confirm.cleaned_data["reason"])
        except StaleSecondFactor as stale:  # step-up: a fresh code, then the same form again
            self.message_user(request, f"not started: {stale}", messages.WARNING)
            back = urlencode({name: request.POST.get(name, "") for name in FilterForm.base_fields})
            return HttpResponseRedirect(second_factor_page(f"{request.path}?{back}", stale=True))
        except PermissionDenied as refused:  # audited by tools_app.bulk
            raise DjangoPermissionDenied(refused.message) from None
        except InvalidInput as invalid:
            confirm.add_error(None, invalid.message)
            return None
        self.message_user(request, f"bulk action #{started.pk} started over {started.total} "
                                   "items: the cluster runs it in batches", messages.SUCCESS)
        return HttpResponseRedirect(reverse("admin:tools_app_bulkaction_progress", args=[started.pk]))

    # --- progress and stop -----------------------------------------------------------------------------

    def _visible(self, request: HttpRequest, bulk_id: int) -> bulk.BulkAction:
        if not self.has_view_permission(request):
            raise DjangoPermissionDenied
        row = bulk.visible(bulk.BulkAction.objects.filter(pk=bulk_id), request.user).first()
        if row is None:  # or another tenant's: not said apart
            raise Http404("no such bulk action")
        return row

    def progress_view(self, request: HttpRequest, bulk_id: int) -> HttpResponse:
        row = self._visible(request, bulk_id)
        return TemplateResponse(request, "admin/tools_app/bulk_progress.html", {
            **self.admin_site.each_context(request),
            "title": f"Bulk action #{row.pk}: {bulk.ACTIONS[row.action].label}",
            "opts": self.opts, "bulk": row, "progress": bulk.progress(row),
            "unfinished": row.state in (bulk.BulkState.RUNNING, bulk.BulkState.STOPPING),
            "may_stop": row.state == bulk.BulkState.RUNNING and request.user.has_perm(bulk.RUN_PERMISSION),
            "stop_url": reverse("admin:tools_app_bulkaction_stop", args=[row.pk]),
            "changelist_url": reverse("admin:tools_app_bulkaction_changelist")})

    def stop_view(self, request: HttpRequest, bulk_id: int) -> HttpResponse:
        row = self._visible(request, bulk_id)
        if request.method != "POST":
            return HttpResponseRedirect(reverse("admin:tools_app_bulkaction_progress", args=[row.pk]))
        try:
            stopped = bulk.stop(row, request.user, reason=request.POST.get("reason", ""))
        except PermissionDenied as refused:  # audited by tools_app.bulk
            raise DjangoPermissionDenied(refused.message) from None
        self.message_user(request, "stopping: the batch under way finishes, no further batch starts" if stopped
                          else "not running any more", messages.SUCCESS if stopped else messages.WARNING)
        return HttpResponseRedirect(reverse("admin:tools_app_bulkaction_progress", args=[row.pk]))
