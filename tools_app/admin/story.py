"""A record's story: everything that happened to one operation, in order, with links between its parts.

One operation is an idempotency record, and whatever hangs off it: the approval request and its
decisions, the long task with its step runs and checkpoints, the outbox events it wrote, the
business object it created, and earlier or later operations with the same key. Its story merges
their audit events with the evidence the record keeps (what was asked downstream, what came back,
what an operator checked) and the task's steps and checkpoints, oldest first. The record's page,
the approval's pages and the task's pages all show the same story, so an operator can start
from whichever they were sent.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.contrib import admin
from django.db.models import Model, Q
from django.template.loader import render_to_string
from django.urls import NoReverseMatch, reverse
from django.utils.dateparse import parse_datetime

from tools_app import engine
from tools_app.approvals.models import ApprovalRequest
from tools_app.core import keys
from tools_app.core.models import AuditEvent
from tools_app.engine.models import IdempotencyRecord
from tools_app.outbox.models import OutboxEvent
from tools_app.tasks.models import Checkpoint, StepRun, Task

# What a tool's result names, and the admin page of that business object.
KINDS = {"idempotencyrecord": "record", "approvalrequest": "approval", "task": "task", "outboxevent": "outbox"}


@dataclass(frozen=True)
class Entry:
    at: datetime
    kind: str  # record, approval, task, outbox, evidence, step, checkpoint
    what: str
    who: str = ""
    detail: str = ""
    url: str = ""


@dataclass(frozen=True)
class Link:
    label: str
    url: str
    note: str = ""


def record_of(obj: Model) -> IdempotencyRecord | None:
    """The operation `obj` belongs to: a record itself, an approval request's or a task's record."""
    if isinstance(obj, IdempotencyRecord):
        return obj
    return getattr(obj, "record", None)


def render(obj: Model) -> str:
    """The story of `obj`'s operation, as HTML for a read-only field."""
    record = record_of(obj)
    if record is None:
        return "—"
    return render_to_string("admin/tools_app/story.html", {"links": links(record, shown=obj),
                                                            "entries": entries(record)})


def entries(record: IdempotencyRecord) -> list[Entry]:
    approval = ApprovalRequest.objects.filter(record=record).first()
    task = Task.objects.filter(record=record).first()
    events = list(OutboxEvent.objects.filter(record=record).only("id", "kind"))
    objects: list[Model] = [record, *(o for o in (approval, task) if o is not None), *events]
    about = Q(pk__in=[])
    for obj in objects:
        about |= Q(object_type=_concrete(obj)._meta.model_name, object_id=str(obj.pk))
    found = [_audited(event) for event in AuditEvent.objects.filter(about).order_by("created_at", "pk")]
    found += [_evidence(item) for item in record.evidence or [] if parse_datetime(str(item.get("at", "")))]
    if task is not None:
        found += _steps(task)
    return sorted(found, key=lambda entry: entry.at)


def links(record: IdempotencyRecord, *, shown: Model | None = None) -> list[Link]:
    """The parts of the operation, each with its page (the one being shown is left out)."""
    found = [Link(f"Idempotency record #{record.pk}", _url("idempotencyrecord", record.pk),
                  f"{record.tool}, {record.status}, key digest {keys.key_digest(record.key)}")]
    approval = ApprovalRequest.objects.filter(record=record).prefetch_related("decisions__user").first()
    if approval is not None:
        decisions = "; ".join(f"{d.user.get_username()} {d.verdict}d" + (f" ({d.reason})" if d.reason else "")
                              for d in approval.decisions.order_by("created_at"))
        found.append(Link(f"Approval request #{approval.pk}", reverse("admin:approval_link", args=[approval.pk]),
                          f"{approval.status}, {approval.approvals} of {approval.required_approvals} approvals"
                          + (f": {decisions}" if decisions else "")))
    task = Task.objects.filter(record=record).first()
    if task is not None:
        found.append(Link(f"Task {task.pk}", _url("task", task.pk),
                          f"{task.status}, {len(task.completed_steps)} of {task.steps_total} steps checkpointed"))
    for event in OutboxEvent.objects.filter(record=record).order_by("created_at"):
        found.append(Link(f"Outbox event {event.kind}", _url("outboxevent", event.pk), event.status))
    found += created_by(record)
    others = engine.records_with_key(record.key, tenant_ids=[record.tenant_id], tools=[record.tool]).exclude(
        pk=record.pk).order_by("created_at")
    for other in others:
        found.append(Link(f"Idempotency record #{other.pk}", _url("idempotencyrecord", other.pk),
                          f"the same key, {'retired' if other.retired_at else 'live'}: {other.status}"))
    return [link for link in found if link.url and not _same(link, shown)]


def _same(link: Link, shown: Model | None) -> bool:
    """Whether `link` is the page being shown (a queue's proxy is its row's own page too)."""
    if shown is None:
        return False
    names = {IdempotencyRecord: "Idempotency record #", ApprovalRequest: "Approval request #", Task: "Task "}
    label = names.get(_concrete(shown))
    return label is not None and link.label == f"{label}{shown.pk}"


def created_by(record: IdempotencyRecord) -> list[Link]:
    """What the operation created in an installed app (the demo's order, an adopter's object): the rows of
    every other app's model that points at the record and has a console page."""
    found = []
    for relation in IdempotencyRecord._meta.related_objects:
        model = relation.related_model
        if model._meta.app_label == "tools_app" or not admin.site.is_registered(model):
            continue
        for obj in model._default_manager.filter(**{relation.field.name: record}).only("pk"):
            url = reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_change", args=[obj.pk])
            found.append(Link(f"{str(model._meta.verbose_name).capitalize()} #{obj.pk}", url, "what it created"))
    return found


def _concrete(obj: Model) -> type[Model]:
    """The model whose table holds `obj` (a proxy's row is its concrete model's)."""
    concrete = obj._meta.concrete_model
    assert concrete is not None  # only an abstract model has none, and it has no rows
    return concrete


def _url(model_name: str, pk: Any) -> str:
    try:
        return reverse(f"admin:tools_app_{model_name}_change", args=[pk])
    except NoReverseMatch:
        return ""


def _audited(event: AuditEvent) -> Entry:
    detail = event.reason
    if event.after:
        detail = f"{detail} {json.dumps(event.after, sort_keys=True, default=str)}".strip()
    return Entry(event.created_at, KINDS.get(event.object_type, event.object_type), event.action, event.actor,
                 detail, _url(event.object_type, event.object_id) if event.object_type != "idempotencyrecord" else "")


def _evidence(item: dict[str, Any]) -> Entry:
    facts = {name: value for name, value in item.items() if name not in ("at", "source", "actor")}
    at = parse_datetime(item["at"])
    assert at is not None  # entries() passes only evidence with a time
    return Entry(at, "evidence", f"evidence from the {item.get('source', '?')}",
                 item.get("actor", ""), json.dumps(facts, sort_keys=True, default=str))


def _steps(task: Task) -> list[Entry]:
    found = []
    for run in StepRun.objects.filter(task=task):
        found.append(Entry(run.started_at, "step", f"step {run.step} started", run.worker,
                           f"attempt {run.attempt}"))
        if run.finished_at:
            found.append(Entry(run.finished_at, "step", f"step {run.step} {run.outcome}", run.worker, run.error))
    for checkpoint in Checkpoint.objects.filter(task=task):
        found.append(Entry(checkpoint.finished_at, "checkpoint", f"checkpoint {checkpoint.sequence}: {checkpoint.step}",
                           "", f"sha256 {checkpoint.checksum[:16]}…"))
    return found
