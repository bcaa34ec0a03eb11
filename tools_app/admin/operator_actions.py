"""Operator actions and queues: one pattern for every queue page in the admin.

A queue is a proxy model whose admin subclasses `QueueAdmin`: a read-only,
tenant-scoped list, oldest first, with `operator_actions`. An operator
action (`OperatorAction`) is a button on the object's page and an action on
the list; either way the operator confirms on a form (with a reason field,
required or optional), and `perform` calls the concept module, which makes
the change in one transaction with its audit event and refuses (with an
exception that is shown, never swallowed) what is not allowed.

Who may: each action names the concept's `Permit` (tools_app.access). The
concept function checks it itself, whoever calls it; the admin asks the same
Permit to show a button, and again before it shows a confirmation form or
runs anything, on the object page and on the list alike. A crafted GET or
POST by someone without the permission, or on another tenant's object, or from a session that
entered no second-factor code (access.authorize checks that too), is answered 403 and its refusal
is an audit event; a person who opens an action's form unverified is sent to the second-factor page.

To add a queue (e.g. UNKNOWN outcomes): a proxy model with the right
verbose name, a `QueueAdmin` subclass with `queue_filter`, list columns and
`operator_actions = [OperatorAction(...)]`, and the action permissions in
tools_app.access.roles.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from django import forms
from django.contrib import messages
from django.contrib.admin import helpers
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.html import format_html

from tools_app import access
from tools_app.access.second_factor import SecondFactorRequired, StaleSecondFactor
from tools_app.admin.generic import ModelAdmin, ModelT
from tools_app.admin.queues import LiveQueue
from tools_app.admin.scoping import ReadOnlyAdmin, TenantScopedAdmin
from tools_app.core import audit, errors

REASON_REQUIRED, REASON_OPTIONAL = "required", "optional"


class NeedsSecondFactor(DjangoPermissionDenied):
    """Refused (403, audited) because the session entered no second-factor code."""


def second_factor_page(next_url: str, *, stale: bool = False) -> str:
    return f"{reverse('admin:second_factor')}?{urlencode({'next': next_url, **({'stale': '1'} if stale else {})})}"
# A list action, as Django calls it: (model admin, request, the selected rows) -> a page to show, or None.
BulkAction = Callable[[ModelAdmin[ModelT], HttpRequest, QuerySet[ModelT]], HttpResponse | None]


@dataclass(frozen=True)
class OperatorAction:
    name: str  # URL segment and admin action name, e.g. "approve"
    label: str  # button text, e.g. "Approve"
    permit: access.Permit  # who may: the Permit the concept function checks, e.g. reconciliation.FORCE_EXPIRE
    perform: Callable[..., str]  # (request, obj, reason, **extra_fields): does it; returns the message to show
    refused: tuple[type[Exception], ...] = ()  # exceptions that mean "not done, and why"
    reason: str = REASON_OPTIONAL
    help_text: str = ""
    style: str = "default"  # "danger" paints the button red
    # More inputs the action needs besides the reason, passed to `perform` by
    # name, e.g. {"downstream_reference": forms.CharField()}.
    extra_fields: dict[str, forms.Field] = field(default_factory=dict)


class ActionForm(forms.Form):
    reason = forms.CharField(widget=forms.Textarea(attrs={"rows": 3, "cols": 60}), required=False)

    def __init__(self, *args: Any, action: OperatorAction, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["reason"].required = action.reason == REASON_REQUIRED
        self.fields["reason"].help_text = action.help_text
        self.fields.update(copy.deepcopy(action.extra_fields))

    @property
    def extras(self) -> dict[str, Any]:
        return {name: value for name, value in self.cleaned_data.items() if name != "reason"}


class OperatorActionsAdmin(ModelAdmin[ModelT]):
    """Admin with `operator_actions`, each on the object page and on the list."""

    operator_actions: list[OperatorAction] = []
    change_form_template = "admin/tools_app/operator_change_form.html"

    # --- wiring -------------------------------------------------------------------

    def get_urls(self) -> list[URLPattern]:
        return [
            path("<path:object_id>/act/<str:action_name>/", self.admin_site.admin_view(self.action_view),
                 name=self._url_name("act")),
        ] + super().get_urls()

    def _url_name(self, view: str) -> str:
        return f"{self.opts.app_label}_{self.opts.model_name}_{view}"

    def get_actions(self, request: HttpRequest) -> dict[str, tuple[Callable[..., str], str, str] | None]:
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)
        for action in self.operator_actions:
            if self._allowed(request, action):
                # The stubs type an action as returning str; Django's return a response or None.
                actions[action.name] = (self._bulk(action), action.name, f"{action.label} selected")  # type: ignore[assignment]
        return actions

    def _allowed(self, request: HttpRequest, action: OperatorAction) -> bool:
        """Whether to offer the action at all (the tenant is checked per object, by `_authorize`)."""
        return request.user.has_perm(action.permit.permission)

    def _action(self, name: str) -> OperatorAction:
        for action in self.operator_actions:
            if action.name == name:
                return action
        raise DjangoPermissionDenied

    def _authorize(self, request: HttpRequest, action: OperatorAction, objects: Iterable[ModelT]) -> None:
        """Refuse (403) unless the user may do `action` on every one of `objects`; each refusal is audited."""
        refusals: list[str] = []
        second_factor_missing = False
        for obj in objects:
            try:
                access.authorize(request.user, action.permit, obj)
            except errors.PermissionDenied as refused:
                refusals.append(f"{self._label(obj)}: {refused.message}")
                second_factor_missing |= isinstance(refused, SecondFactorRequired)
        if not refusals and not self._allowed(request, action):
            # No single object to refuse it on (nothing selected, or "select all"): audited all the same.
            refusals.append(f"you may not {action.permit.what}")
            access.audit_refusal(action.permit, self.model, audit.user_actor(request.user), refusals[0])
        if refusals:
            raise (NeedsSecondFactor if second_factor_missing else DjangoPermissionDenied)("; ".join(refusals))

    def _target(self, object_id: str) -> ModelT | None:
        """The object by id, whatever its tenant: another tenant's object is refused, not hidden."""
        try:
            return self.model._default_manager.filter(pk=object_id).first()
        except (ValueError, ValidationError):  # not an id of this model (e.g. a task's UUID)
            return None

    def render_change_form(self, request: HttpRequest, context: dict[str, Any], add: bool = False, change: bool = False,
                           form_url: str = "", obj: ModelT | None = None) -> HttpResponse:
        context["operator_actions"] = [
            (action, reverse(f"admin:{self._url_name('act')}", args=[obj.pk, action.name]))
            for action in self.operator_actions if obj is not None and self._allowed(request, action)
        ]
        return super().render_change_form(request, context, add=add, change=change, form_url=form_url, obj=obj)

    # --- one object: /<pk>/act/<name>/ ----------------------------------------------

    def action_view(self, request: HttpRequest, object_id: str, action_name: str) -> HttpResponse:
        action = self._action(action_name)
        target = self._target(object_id)
        if target is None:
            raise Http404
        try:
            self._authorize(request, action, [target])  # GET too: the form is the first step of the action
        except NeedsSecondFactor:
            if request.method == "POST":  # refused (and audited); a person's next step is the GET
                raise
            return HttpResponseRedirect(second_factor_page(request.get_full_path()))
        # Through the queue's (scoped) queryset: an object that left the queue is a 404 here.
        obj = get_object_or_404(self.get_queryset(request), pk=object_id)
        form = ActionForm(request.POST or None, action=action)
        if request.method == "POST" and form.is_valid():
            try:
                self._perform(request, action, obj, form.cleaned_data["reason"], form.extras)
            except StaleSecondFactor as stale:  # a step-up: a fresh code, then the same form again
                self.message_user(request, f"{self._label(obj)}: not done: {stale}", messages.WARNING)
                return HttpResponseRedirect(second_factor_page(request.get_full_path(), stale=True))
            return HttpResponseRedirect(reverse(f"admin:{self._url_name('changelist')}"))
        return self._confirmation(request, action, [obj], form)

    # --- several objects: a list action with the same confirmation form ------------------

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        # Before Django's own checks, which refuse a user who may not view the
        # list or drop an action not offered to them, without an audit event.
        if request.method == "POST" and (action := self._posted_action(request)) is not None:
            selected = request.POST.getlist(helpers.ACTION_CHECKBOX_NAME)
            try:
                objects = list(self.model._default_manager.filter(pk__in=selected))
            except (ValueError, ValidationError):
                objects = []
            self._authorize(request, action, objects)
        return super().changelist_view(request, extra_context)

    def _posted_action(self, request: HttpRequest) -> OperatorAction | None:
        """The operator action a changelist POST asks for, read as ModelAdmin.response_action reads it."""
        try:
            index = int(request.POST.get("index", 0))
        except ValueError:
            index = 0
        names = request.POST.getlist("action")
        if not -len(names) <= index < len(names):  # as Django indexes it
            return None
        name = names[index]
        return next((action for action in self.operator_actions if action.name == name), None)

    def _bulk(self, action: OperatorAction) -> BulkAction[ModelT]:
        def run(modeladmin: ModelAdmin[ModelT], request: HttpRequest,
                queryset: QuerySet[ModelT]) -> HttpResponse | None:
            form = ActionForm(request.POST if request.POST.get("confirm") else None, action=action)
            if form.is_bound and form.is_valid():
                for obj in queryset:
                    try:
                        self._perform(request, action, obj, form.cleaned_data["reason"], form.extras)
                    except StaleSecondFactor as stale:  # the rest wait for a fresh code
                        self.message_user(request, f"{self._label(obj)} and after: not done: {stale}",
                                          messages.WARNING)
                        return HttpResponseRedirect(second_factor_page(
                            reverse(f"admin:{self._url_name('changelist')}"), stale=True))
                return None
            return self._confirmation(request, action, list(queryset), form, bulk=True)

        run.__name__ = action.name
        return run

    def _perform(self, request: HttpRequest, action: OperatorAction, obj: ModelT, reason: str,
                 extras: dict[str, Any]) -> None:
        try:
            message = action.perform(request, obj, reason, **extras)
            self.message_user(request, f"{self._label(obj)}: {message}", messages.SUCCESS)
        except StaleSecondFactor:
            raise  # the page asks for a fresh code (action_view)
        except action.refused as refused:
            self.message_user(request, f"{self._label(obj)}: not done: {refused}", messages.ERROR)

    def _label(self, obj: ModelT) -> str:
        # Not str(obj): it may show the state from before the action.
        return f"{self.opts.verbose_name} #{obj.pk}"

    def _confirmation(self, request: HttpRequest, action: OperatorAction, objects: list[ModelT], form: ActionForm,
                      bulk: bool = False) -> TemplateResponse:
        context = {
            **self.admin_site.each_context(request),
            "title": f"{action.label}: confirm",
            "opts": self.opts, "action": action, "objects": objects, "form": form, "bulk": bulk,
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "changelist_url": reverse(f"admin:{self._url_name('changelist')}"),
        }
        return TemplateResponse(request, "admin/tools_app/operator_action.html", context)


class QueueAdmin(LiveQueue[ModelT], OperatorActionsAdmin[ModelT], TenantScopedAdmin[ModelT], ReadOnlyAdmin[ModelT]):
    """A work queue: the rows matching `queue_filter`, oldest first, scoped to the user's tenants; on the
    console's home with its count, and refreshing itself (tools_app.admin.queues)."""

    queue_filter: dict[str, Any] = {}
    ordering = ["created_at", "pk"]
    list_per_page = 50

    def get_queryset(self, request: HttpRequest) -> QuerySet[ModelT]:
        return super().get_queryset(request).filter(**self.queue_filter)

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        title = f"{str(self.opts.verbose_name_plural).capitalize()}, oldest first"
        return super().changelist_view(request, {"title": title, **(extra_context or {})})


# --- column helpers shared by the queues ---------------------------------------------------


def age(since: datetime | None) -> str:
    return _duration(timezone.now() - since) if since else "—"


def time_left(until: datetime | None) -> str:
    if until is None:
        return "—"
    left = until - timezone.now()
    return f"in {_duration(left)}" if left > timedelta(0) else f"overdue {_duration(-left)}"


def _duration(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    if seconds < 90:
        return f"{seconds}s"
    if seconds < 90 * 60:
        return f"{seconds // 60}m"
    if seconds < 48 * 3600:
        return f"{seconds // 3600}h {seconds % 3600 // 60}m"
    return f"{seconds // 86400}d {seconds % 86400 // 3600}h"


def pretty_json(value: Any) -> str:
    return format_html("<pre style='white-space:pre-wrap;margin:0'>{}</pre>",
                       json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str))
