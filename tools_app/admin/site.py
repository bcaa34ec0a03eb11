"""The operators' console: Django's admin site, arranged around the work.

The home page leads with the four work queues (each with its count, the age of its oldest item
and how many stand out), then a glance at the dashboard, then everything else: the pages to look
into (records, requests, tasks, events, the audit log), the reference
data (tenants, tokens, settings), and then each installed app's own pages (the demo's business
objects). The navigation on every page follows the same order, with each
queue's count as a badge. One search box (`find/`) finds a record by whatever is quoted.

This is the admin's default site (tools_app.apps.ConsoleAdminConfig), so every `@admin.register`
lands here. Keep this module free of imports that register admins: it is imported while the first
of them registers.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import Model
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, URLResolver, path, reverse

from tools_app import access
from tools_app.access import passkeys, second_factor
from tools_app.admin.approval_links import decide_view
from tools_app.admin.find import FindForm, find_view
from tools_app.admin.operator_actions import QueueAdmin, age, second_factor_page
from tools_app.admin.queues import QueueSummary
from tools_app.admin.second_factor import ConsoleLoginForm, second_factor_view
from tools_app.approvals.models import ApprovalRequest, ApprovalStatus
from tools_app.metrics import dashboard

# The console's sections, in order: (name, label, model names). Models not listed follow, by app.
QUEUES = ["approvalqueue", "unknownoutcomequeue", "taskneedingattention", "deadletter"]
SECTIONS = [
    ("Work queues", "queues", QUEUES),
    ("Look into", "evidence", ["dashboard", "idempotencyrecord", "approvalrequest", "approvaldecision", "task",
                               "outboxevent", "downstream", "bulkaction", "scheduledoperation", "auditevent",
                               "auditseal", "auditcheckpoint", "auditarchive"]),
    ("Reference data", "reference", ["tenant", "apitoken", "agentconnection", "tenantaccess", "approvalsettings",
                                     "tenantlimits", "retentionoverride", "auditretention", "auditorkey",
                                     "notificationchannel"]),
]


class ConsoleSite(admin.AdminSite):
    site_header = "idemops"
    site_title = "idemops console"
    index_title = "Work queues"
    index_template = "admin/tools_app/console.html"
    site_url = None  # no public site: the console is the whole web UI
    login_form = ConsoleLoginForm  # Django's, with the authenticator code

    def get_urls(self) -> list[URLResolver | URLPattern]:
        return [
            path("find/", self.admin_view(find_view(self)), name="find"),
            path("second-factor/", self.admin_view(second_factor_view(self)), name="second_factor"),
            path("approval/<int:request_id>/", self.admin_view(self.approval_link), name="approval_link"),
            path("approval/decide/<str:token>/", self.admin_view(decide_view(self)), name="approval_decide"),
        ] + super().get_urls()

    # --- navigation ------------------------------------------------------------------------------

    def get_app_list(self, request: HttpRequest, app_label: str | None = None) -> list[dict[str, Any]]:
        apps = super().get_app_list(request, app_label)
        if app_label is not None:
            return apps
        models = {m["model"]._meta.model_name: m for app in apps if app["app_label"] == "tools_app"
                  for m in app["models"]}
        sections: list[dict[str, Any]] = []
        summaries = self.queue_summaries(request)
        for name, label, model_names in SECTIONS:
            if label == "queues":  # every QueueAdmin, listed ones first
                model_names = [str(model._meta.model_name) for model in summaries]
            listed = [models.pop(model_name) for model_name in model_names if model_name in models]
            for entry in listed:
                entry["queue"] = summaries.get(entry["model"])
            if listed:
                sections.append({"name": name, "app_label": label, "app_url": "", "has_module_perms": True,
                                 "models": listed})
        rest = [app for app in apps if app["app_label"] != "tools_app"]
        if models:  # pages added later that no section names yet
            sections.append({"name": "More", "app_label": "tools_app", "app_url": "", "has_module_perms": True,
                             "models": sorted(models.values(), key=lambda m: m["name"])})
        return sections + rest

    # --- the home page ---------------------------------------------------------------------------

    def index(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> TemplateResponse:
        apps = self.get_app_list(request)
        return super().index(request, {
            "queues": [(queue, age(queue.oldest)) for queue in self.queue_summaries(request).values()],
            "app_list": [app for app in apps if app["app_label"] != "queues"],
            "glance": self._glance(request), "find_form": FindForm(user=request.user), **(extra_context or {})})

    def queue_summaries(self, request: HttpRequest) -> dict[type[Model], QueueSummary]:
        """model -> QueueSummary of each work queue the user may see, in the console's order (once per request)."""
        cached: dict[type[Model], QueueSummary] | None = getattr(request, "_console_queues", None)
        if cached is None:
            by_name = {model._meta.model_name: model_admin for model, model_admin in self._registry.items()
                       if isinstance(model_admin, QueueAdmin) and model_admin.has_view_permission(request)}
            ordered = [by_name.pop(name) for name in QUEUES if name in by_name] + list(by_name.values())
            cached = {queue.model: queue.summary(request) for queue in ordered}
            # A cache for this request only (HttpRequest declares no such attribute).
            request._console_queues = cached  # type: ignore[attr-defined]
        return cached

    def _glance(self, request: HttpRequest) -> dict[str, Any] | None:
        """The dashboard's headline figures over the last hour, if the user may see the dashboard."""
        if not request.user.has_perm("tools_app.view_dashboard"):
            return None
        snap = dashboard.snapshot(request.user, "hour")
        writes = sum(s.writes for s in snap.tools)
        return {
            "calls": sum(s.calls for s in snap.tools), "writes": writes,
            "hit_rate_percent": _percent(sum(s.count("replayed") for s in snap.tools), writes),
            "conflict_rate_percent": _percent(sum(s.count("conflict") for s in snap.tools), writes),
            "unknown": sum(s.unknown for s in snap.tools), "overrun": sum(s.overrun_leases for s in snap.tools),
            "approvals_waiting": sum(s.approvals_waiting for s in snap.tools),
            "url": reverse("admin:tools_app_dashboard_changelist"),
        }

    # --- links in approvers' messages ------------------------------------------------------------

    def login(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        """Django's admin login; a password-only login of a person with a passkey goes on to the second-factor
        page (its second step), where the passkey is asked for, then to where the login was going."""
        response = super().login(request, extra_context)
        user = request.user
        if (request.method == "POST" and response.status_code == 302 and user.is_authenticated
                and not second_factor.verified(user) and passkeys.passkeys_of(user)):
            return HttpResponseRedirect(second_factor_page(response["Location"]))
        return response

    def approval_link(self, request: HttpRequest, request_id: int) -> HttpResponseRedirect:
        """One request's page, whatever became of it: the queue's page while it waits, its history after.
        The link in an approver's message: it opens for a session that entered its second factor (the
        person is asked for the code first, then comes back here)."""
        if not second_factor.verified(request.user):
            return HttpResponseRedirect(second_factor_page(request.get_full_path()))
        approval = access.scope(ApprovalRequest.objects.all(), request.user).filter(pk=request_id).first()
        if approval is None:
            raise Http404("no such approval request among the tenants you may see")
        if approval.status == ApprovalStatus.PENDING and request.user.has_perm("tools_app.view_approvalqueue"):
            return HttpResponseRedirect(reverse("admin:tools_app_approvalqueue_change", args=[approval.pk]))
        return HttpResponseRedirect(reverse("admin:tools_app_approvalrequest_change", args=[approval.pk]))


def _percent(part: int, whole: int) -> float | None:
    return part / whole * 100 if whole else None
