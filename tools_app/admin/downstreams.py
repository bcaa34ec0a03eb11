"""The "Downstream systems" page: each downstream's circuit breaker (state, failures, next probe,
last failure), the operators' pauses, and the actions of an incident: pause or resume a tool, a
downstream system or one tenant's writes (with a reason the agents hear), and close a breaker by
hand once the downstream is known to be back.

Thin: pauses.pause/resume check PAUSE, the tenant and the second factor themselves (access.authorize)
and audit the change; breaker.reset checks the same for closing a breaker by hand. Names are checked
against the registry (toolkit.pause_targets).

A crafted POST without the permission, or from a session that entered no second-factor code, is
answered 403 and its refusal is an audit event; nothing changes.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.db.models import Q, QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse

from tools_app import access, incidents
from tools_app.access.second_factor import verified
from tools_app.admin.operator_actions import second_factor_page, time_left
from tools_app.admin.scoping import ReadOnlyAdmin
from tools_app.core import audit
from tools_app.core.errors import InvalidInput, PermissionDenied
from tools_app.incidents import breaker
from tools_app.incidents.models import BreakerState, Downstream, Pause, PauseScope
from tools_app.toolkit import pause_targets

PAUSE = incidents.PAUSE


class PauseForm(forms.Form):
    scope = forms.ChoiceField(choices=PauseScope.choices)
    target = forms.CharField(max_length=200, help_text="The tool's or downstream system's name, or the tenant's "
                                                       "slug.")
    reason = forms.CharField(widget=forms.Textarea(attrs={"rows": 3, "cols": 60}), max_length=1000,
                             help_text="The agents hear it: calls answer transient with it until you resume.")


class ReasonForm(forms.Form):
    reason = forms.CharField(widget=forms.Textarea(attrs={"rows": 3, "cols": 60}), required=False, max_length=1000)


class CloseForm(forms.Form):
    reason = forms.CharField(widget=forms.Textarea(attrs={"rows": 3, "cols": 60}), max_length=1000,
                             help_text="How you know the downstream system is back.")


@admin.register(Downstream)
class DownstreamAdmin(ReadOnlyAdmin[Downstream]):
    change_list_template = "admin/tools_app/downstreams.html"
    list_display = ["name", "breaker", "failures", "next_probe", "opened_at", "last_failure_text"]
    list_display_links = None
    search_fields = ["name"]
    ordering = ["name"]

    # --- the page ---------------------------------------------------------------------------------

    @admin.display(description="breaker", ordering="state")
    def breaker(self, obj: Downstream) -> str:
        if obj.state not in BreakerState.values:  # a corrupt row: said, not hidden (the page warns too)
            return f"unreadable ({obj.state!r})"
        return str(BreakerState(obj.state).label)

    @admin.display(description="next probe", ordering="next_probe_at")
    def next_probe(self, obj: Downstream) -> str:
        return time_left(obj.next_probe_at) if obj.state == BreakerState.OPEN else "—"

    @admin.display(description="last failure")
    def last_failure_text(self, obj: Downstream) -> str:
        return obj.last_failure or "—"

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        may_act = request.user.has_perm(PAUSE.permission)
        pauses = [(row, self._target_label(row), reverse("admin:tools_app_downstream_resume", args=[row.pk]))
                  for row in self._visible_pauses(request)]
        context = {
            "title": "Downstream systems: circuit breakers and pauses",
            # Read afresh: the console says what every process sees at most IDEMOPS_INCIDENT_STATE_SECONDS later.
            "state_problem": incidents.snapshot(fresh=True).problem,
            "pauses": pauses, "may_act": may_act,
            "pause_url": reverse("admin:tools_app_downstream_pause"),
            "close_urls": [(row.name, reverse("admin:tools_app_downstream_close", args=[row.pk]))
                           for row in Downstream.objects.filter(state__in=[BreakerState.OPEN, BreakerState.PROBING])]
            if may_act else [],
            **(extra_context or {}),
        }
        return super().changelist_view(request, context)

    def _visible_pauses(self, request: HttpRequest) -> QuerySet[Pause]:
        """Every tool's and downstream's pause (the platform's), and the pauses of tenants the user may see."""
        visible = access.visible_tenant_ids(request.user)
        rows = Pause.objects.select_related("tenant")
        return rows if visible is None else rows.filter(Q(tenant__isnull=True) | Q(tenant_id__in=visible))

    @staticmethod
    def _target_label(row: Pause) -> str:
        return f"tenant {row.tenant.slug}" if row.tenant is not None else f"{row.scope} {row.target}"

    # --- the actions ------------------------------------------------------------------------------

    def get_urls(self) -> list[URLPattern]:
        return [
            path("pause/", self.admin_site.admin_view(self.pause_view), name="tools_app_downstream_pause"),
            path("pauses/<int:pause_id>/resume/", self.admin_site.admin_view(self.resume_view),
                 name="tools_app_downstream_resume"),
            path("<int:downstream_id>/close/", self.admin_site.admin_view(self.close_view),
                 name="tools_app_downstream_close"),
        ] + super().get_urls()

    def pause_view(self, request: HttpRequest) -> HttpResponse:
        if (first := self._first_step(request)) is not None:
            return first
        form = PauseForm(request.POST or None, initial=request.GET.dict())
        if request.method == "POST" and form.is_valid():
            scope, target, reason = (form.cleaned_data[name] for name in ("scope", "target", "reason"))
            try:
                target = pause_targets.check(scope, target)
                incidents.pause(PauseScope(scope), target, request.user, reason=reason)
            except InvalidInput as invalid:
                form.add_error(None, invalid.message)
            except PermissionDenied as refused:  # audited by access.authorize
                raise DjangoPermissionDenied(refused.message) from None
            else:
                self.message_user(request, f"{scope} {target} paused: calls answer transient with your reason "
                                           "until you resume it", messages.SUCCESS)
                return HttpResponseRedirect(reverse("admin:tools_app_downstream_changelist"))
        return self._form_page(request, "Pause a tool, a downstream system or a tenant's writes", form, "Pause",
                               known={"tools": pause_targets.names(PauseScope.TOOL),
                                      "downstreams": pause_targets.names(PauseScope.DOWNSTREAM)})

    def resume_view(self, request: HttpRequest, pause_id: int) -> HttpResponse:
        row = Pause.objects.select_related("tenant").filter(pk=pause_id).first()
        if row is None:
            raise Http404("no such pause: resumed already?")
        if (first := self._first_step(request)) is not None:
            return first
        form = ReasonForm(request.POST or None)
        if request.method == "POST" and form.is_valid():
            target = row.tenant.slug if row.tenant is not None else row.target
            try:
                resumed = incidents.resume(PauseScope(row.scope), target, request.user,
                                           reason=form.cleaned_data["reason"])
            except PermissionDenied as refused:
                raise DjangoPermissionDenied(refused.message) from None
            self.message_user(request, f"{self._target_label(row)}: {'resumed' if resumed else 'was not paused'}",
                              messages.SUCCESS)
            return HttpResponseRedirect(reverse("admin:tools_app_downstream_changelist"))
        return self._form_page(request, f"Resume {self._target_label(row)} (paused: {row.reason})", form, "Resume")

    def close_view(self, request: HttpRequest, downstream_id: int) -> HttpResponse:
        row = Downstream.objects.filter(pk=downstream_id).first()
        if row is None:
            raise Http404("no such downstream system")
        if (first := self._first_step(request)) is not None:
            return first
        form = CloseForm(request.POST or None)
        if request.method == "POST" and form.is_valid():
            try:
                closed = breaker.reset(row, request.user, reason=form.cleaned_data["reason"])
            except PermissionDenied as refused:
                raise DjangoPermissionDenied(refused.message) from None
            self.message_user(request, f"{row.name}: " + ("circuit breaker closed: calls run again" if closed else
                              "not closed: its breaker was not open (it may have closed by itself)"),
                              messages.SUCCESS if closed else messages.WARNING)
            return HttpResponseRedirect(reverse("admin:tools_app_downstream_changelist"))
        return self._form_page(request, f"Close the circuit breaker of {row.name} by hand", form, "Close breaker",
                               subject=row)

    def _first_step(self, request: HttpRequest) -> HttpResponse | None:
        """Refuse (403, audited) who may not pause at all; send a person without a second factor to enter
        it (a GET: the form is the action's first step). The concept functions check both again."""
        if not request.user.has_perm(PAUSE.permission):
            refusal = f"missing permission: you do not have the permission to {PAUSE.what}"
            access.audit_refusal(PAUSE, Pause, audit.user_actor(request.user), refusal)
            raise DjangoPermissionDenied(refusal)
        if request.method != "POST" and not verified(request.user):
            return HttpResponseRedirect(second_factor_page(request.get_full_path()))
        return None

    def _form_page(self, request: HttpRequest, title: str, form: forms.Form, submit: str,
                   **extra: Any) -> TemplateResponse:
        return TemplateResponse(request, "admin/tools_app/downstream_action.html", {
            **self.admin_site.each_context(request), "title": title, "opts": self.opts, "form": form,
            "submit": submit, "changelist_url": reverse("admin:tools_app_downstream_changelist"), **extra})
