"""Find by key: one search box for whatever an agent, a customer or a log line quotes.

An operator pastes an idempotency key (and may pick the tenant and the tool), a key digest from a
log line, an operation id, a task id, an approval request id, a record id, a downstream key, a
trace id or a business attribute (a tool's search field: `order_id=42`, or the value alone); every
reading of the text that fits is tried, within the tenants the operator may see,
and what matches is listed (one match: its page opens at once).

Raw keys stay out of logs and URLs: the box is a POST form (never a query string, so never in an
access log, a browser history or a Referer), the view is `sensitive_post_parameters` (Django's
error reports leave it out), the page shows only the key's digest, and the record is looked up by
the unique index on (tenant, tool, key) for each candidate tenant and tool.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, cast

from django import forms
from django.contrib.admin import AdminSite
from django.contrib.auth.models import AnonymousUser, User
from django.db.models import Model, Q, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.views.decorators.debug import sensitive_post_parameters

from tools_app import access, engine
from tools_app.access.models import Tenant
from tools_app.admin.generic import ModelT
from tools_app.approvals.models import ApprovalRequest
from tools_app.core import keys
from tools_app.engine.models import IdempotencyRecord
from tools_app.outbox.models import OutboxEvent
from tools_app.tasks.models import Task
from tools_app.toolkit import registry

DIGEST = re.compile(rf"[0-9a-f]{{{keys.KEY_DIGEST_LENGTH}}}")
NUMBER = re.compile(r"#?(\d{1,18})")
TRACE_ID_MAX = 100
# What a search finds.
Found = IdempotencyRecord | ApprovalRequest | Task | OutboxEvent


@dataclass
class Match:
    kind: str  # "idempotency record", "approval request", "task", "outbox event"
    obj: Model
    url: str
    title: str
    status: str
    tenant: str
    created_at: datetime
    how: list[str] = field(default_factory=list)  # which readings of the text found it


def tool_choices() -> list[tuple[str, str]]:
    return [("", "any tool")] + [(spec.name, spec.name) for spec in sorted(registry.all_tools(), key=lambda s: s.name)
                                 if spec.writes or spec.pipeline is not None]


class FindForm(forms.Form):
    q = forms.CharField(max_length=300, label="Key or id", widget=forms.TextInput(attrs={
        "autocomplete": "off", "spellcheck": "false", "size": 48,
        "placeholder": "idempotency key, key digest, operation, task or approval id, downstream key, trace id, "
                       "order_id=42"}))
    tenant = forms.ModelChoiceField(queryset=Tenant.objects.none(), required=False, empty_label="any tenant")
    tool = forms.ChoiceField(required=False)

    def __init__(self, *args: Any, user: User | AnonymousUser, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # The fields declared above (a form's `fields` are typed as any Field).
        tenants = cast("forms.ModelChoiceField[Tenant]", self.fields["tenant"])
        tenants.queryset = access.scope(Tenant.objects.all(), user, "id")
        cast(forms.ChoiceField, self.fields["tool"]).choices = tool_choices()


def find(user: User | AnonymousUser, text: str, *, tenant: Tenant | None = None, tool: str = "") -> list[Match]:
    """What `text` names, among the rows `user` may see (and of `tenant` / `tool` when given)."""
    text = text.strip()
    if not text:
        return []
    found: dict[tuple[str, object], Match] = {}
    for kind, how, rows in _readings(user, text, tenant, tool):
        for obj in rows[:50]:
            match = found.get((kind, obj.pk)) or found.setdefault((kind, obj.pk), _match(kind, obj))
            if how not in match.how:
                match.how.append(how)
    return sorted(found.values(), key=lambda m: m.created_at, reverse=True)


def _readings(user: User | AnonymousUser, text: str, tenant: Tenant | None, tool: str,
              ) -> Iterator[tuple[str, str, QuerySet[Found]]]:
    """(kind, how, queryset) for every reading of `text` that can match something `user` may see."""
    may: Callable[[str], bool] = lambda model: user.has_perm(f"tools_app.view_{model}")  # noqa: E731
    as_uuid = _uuid(text)
    number = NUMBER.fullmatch(text)
    if may("idempotencyrecord"):
        yield from _record_readings(user, text, tenant, tool, as_uuid, number)
    if may("approvalrequest"):
        requests = _visible(ApprovalRequest, user, tenant, tool)
        if number:
            yield "approval request", "approval request id", requests.filter(pk=int(number.group(1)))
        if len(text) <= TRACE_ID_MAX:
            yield "approval request", "trace id", requests.filter(trace_id=text)
    if may("task"):
        tasks = _visible(Task, user, tenant, tool)
        if as_uuid is not None:
            yield "task", "task id", tasks.filter(pk=as_uuid)
        if len(text) <= TRACE_ID_MAX:
            yield "task", "trace id", tasks.filter(trace_id=text)
    if may("outboxevent") and as_uuid is not None:
        yield "outbox event", "event id", _visible(OutboxEvent, user, tenant, tool, "record__tool").filter(pk=as_uuid)


def _visible(model: type[ModelT], user: User | AnonymousUser, tenant: Tenant | None, tool: str,
             tool_field: str | None = "tool") -> QuerySet[ModelT]:
    """`model`'s rows that `user` may see, of `tenant` and `tool` if given."""
    rows = access.scope(model._default_manager.all(), user)
    if tenant is not None:
        rows = rows.filter(tenant=tenant)
    if tool and tool_field:
        rows = rows.filter(**{tool_field: tool})
    return rows


def _record_readings(user: User | AnonymousUser, text: str, tenant: Tenant | None, tool: str,
                     as_uuid: uuid.UUID | None, number: re.Match[str] | None,
                     ) -> Iterator[tuple[str, str, QuerySet[Found]]]:
    """The readings of `text` that can match an idempotency record `user` may see."""
    records = _visible(IdempotencyRecord, user, tenant, tool)
    if keys.KEY_PATTERN.fullmatch(text):
        visible_ids = access.visible_tenant_ids(user)
        tenant_ids = ([tenant.pk] if tenant is not None
                      else visible_ids if visible_ids is not None else Tenant.objects.values_list("id", flat=True))
        tools = [tool] if tool else [name for name, _ in tool_choices()[1:]]
        yield "idempotency record", "idempotency key", engine.records_with_key(text, tenant_ids=tenant_ids,
                                                                               tools=tools)
    if DIGEST.fullmatch(text):
        yield "idempotency record", "key digest", engine.records_with_key_digest(text, records)
    if as_uuid is not None:
        yield "idempotency record", "operation id", records.filter(operation_id=as_uuid)
    if (operation := engine.operation_id_of(text)) is not None:
        yield "idempotency record", "downstream key", records.filter(operation_id=operation)
    if number:
        yield "idempotency record", "record id", records.filter(pk=int(number.group(1)))
    if len(text) <= TRACE_ID_MAX:
        yield "idempotency record", "trace id", records.filter(trace_id=text)
    yield from _attribute_readings(records, text)


def _attribute_readings(records: QuerySet[IdempotencyRecord], text: str,
                        ) -> Iterator[tuple[str, str, QuerySet[Found]]]:
    """A business attribute (a tool's search field: an order id, a payment id): `name=value`, or the value
    alone under any declared name. Each is one `attributes @> {...}` lookup on the GIN index."""
    names = sorted({name for spec in registry.all_tools() for name in spec.search_fields})
    name, sep, value = text.partition("=")
    if sep and name.strip() in names and value.strip():
        yield ("idempotency record", f"attribute {name.strip()}",
               records.filter(attributes__contains={name.strip(): value.strip()}))
    elif len(text) <= engine.ATTRIBUTE_MAX and names:
        either = Q()
        for each in names:
            either |= Q(attributes__contains={each: text})
        yield "idempotency record", "business attribute", records.filter(either)


def _uuid(text: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(text)
    except ValueError:
        return None


def _match(kind: str, obj: Found) -> Match:
    tenant = Tenant.objects.filter(pk=obj.tenant_id).values_list("slug", flat=True).first() or ""
    if isinstance(obj, IdempotencyRecord):  # kind "idempotency record", and so on
        return Match(kind, obj, reverse("admin:tools_app_idempotencyrecord_change", args=[obj.pk]),
                     f"{obj.tool} #{obj.pk} · key digest {keys.key_digest(obj.key)}", obj.status, tenant,
                     obj.created_at)
    if isinstance(obj, ApprovalRequest):
        return Match(kind, obj, reverse("admin:approval_link", args=[obj.pk]), f"#{obj.pk} {obj.summary}",
                     obj.status, tenant, obj.created_at)
    if isinstance(obj, Task):
        return Match(kind, obj, reverse("admin:tools_app_task_change", args=[obj.pk]), f"{obj.tool} task {obj.pk}",
                     obj.status, tenant, obj.created_at)
    return Match(kind, obj, reverse("admin:tools_app_outboxevent_change", args=[obj.pk]), f"{obj.kind} {obj.pk}",
                 obj.status, tenant, obj.created_at)


def find_view(site: AdminSite) -> Callable[[HttpRequest], HttpResponse]:
    """The console's find page (GET: the form; POST: search), for the admin site `site`."""

    @sensitive_post_parameters("q")
    def view(request: HttpRequest) -> HttpResponse:
        form = FindForm(request.POST if request.method == "POST" else None, user=request.user)
        matches, searched = None, ""
        if form.is_bound and form.is_valid():
            text = form.cleaned_data["q"]
            matches = find(request.user, text, tenant=form.cleaned_data["tenant"], tool=form.cleaned_data["tool"])
            if len(matches) == 1:
                return HttpResponseRedirect(matches[0].url, status=303)
            searched = keys.key_digest(text.strip())
            # The pasted text is not sent back: the page shows its digest (a key may carry personal data).
            form = FindForm(user=request.user, initial={"tenant": form.cleaned_data["tenant"],
                                                        "tool": form.cleaned_data["tool"]})
        return TemplateResponse(request, "admin/tools_app/find.html", {
            **site.each_context(request), "title": "Find by key or id", "form": form, "matches": matches,
            "searched_digest": searched})

    return view
