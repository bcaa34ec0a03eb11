"""What a bulk action selects: a target (the UNKNOWN queue, failed or paused tasks, dead-lettered outbox
events) narrowed by a filter, within the tenants the operator may see. Counted in SQL (the dry run), and
frozen into BulkItem rows by one INSERT ... SELECT at confirmation."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from django.db import models
from django.db.models import Q, QuerySet

from tools_app import access, incidents
from tools_app.core.errors import InvalidInput
from tools_app.engine.models import IdempotencyRecord, RecordStatus
from tools_app.outbox.models import OutboxEvent, OutboxStatus
from tools_app.tasks.models import Task, TaskStatus
from tools_app.toolkit.registry import ToolSpec, all_tools, find_tool


class Target(models.TextChoices):
    UNKNOWN = "unknown", "UNKNOWN outcomes"
    TASKS = "tasks", "Failed or paused tasks"
    DEAD_LETTERS = "dead_letters", "Dead-lettered outbox events"


@dataclass(frozen=True)
class Shape:
    """Where a target's rows are and how each filter reaches them."""

    model: type[models.Model]
    queue: Q
    tool: str  # lookup of the tool's name
    error_class: str | None  # lookup of the error class (None: the target has none)
    attributes: str  # lookup of the record's attributes


SHAPES: dict[str, Shape] = {
    Target.UNKNOWN: Shape(IdempotencyRecord, Q(status=RecordStatus.UNKNOWN), "tool", "error_class", "attributes"),
    Target.TASKS: Shape(Task, Q(status__in=[TaskStatus.FAILED, TaskStatus.PAUSED]), "tool", "failure_class",
                        "record__attributes"),
    Target.DEAD_LETTERS: Shape(OutboxEvent, Q(status=OutboxStatus.DEAD), "record__tool", None,
                               "record__attributes"),
}


@dataclass(frozen=True)
class Filter:
    """A bulk filter; every part optional. Stored on the BulkAction as JSON (`as_json`)."""

    target: str
    tool: str = ""
    downstream: str = ""
    error_class: str = ""
    created_after: datetime | None = None
    created_before: datetime | None = None
    tenant: str = ""  # a tenant's slug
    attributes: dict[str, str] = field(default_factory=dict)  # search field -> value

    def as_json(self) -> dict[str, Any]:
        return {name: value.isoformat() if isinstance(value, datetime) else value
                for name, value in asdict(self).items() if value not in ("", None, {})}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Filter:
        times = {name: datetime.fromisoformat(data[name]) for name in ("created_after", "created_before")
                 if data.get(name)}
        return cls(**{**data, **times})


def tools_of(downstream: str) -> list[str]:
    """The tools whose calls reach `downstream` (declared, or learned from the URL's host)."""
    return [spec.name for spec in all_tools() if incidents.downstream_of(spec.name, spec.downstream) == downstream]


def search_field_names() -> list[str]:
    """Every declared search field (tools_app.toolkit: `search_fields`), sorted."""
    return sorted({name for spec in all_tools() for name in spec.search_fields})


def selection(flt: Filter, user: Any) -> QuerySet[Any]:
    """The rows `flt` selects among those `user` may see (unordered: counted, or frozen)."""
    shape = SHAPES.get(flt.target)
    if shape is None:
        raise InvalidInput(f"unknown bulk target {flt.target!r}")
    rows = access.scope(shape.model._default_manager.filter(shape.queue), user).order_by()
    if flt.tool:
        rows = rows.filter(**{shape.tool: flt.tool})
    if flt.downstream:
        rows = rows.filter(**{f"{shape.tool}__in": tools_of(flt.downstream)})
    if flt.error_class:
        if shape.error_class is None:
            raise InvalidInput(f"{Target(flt.target).label} have no error class to filter by")
        rows = rows.filter(**{shape.error_class: flt.error_class})
    if flt.created_after is not None:
        rows = rows.filter(created_at__gte=flt.created_after)
    if flt.created_before is not None:
        rows = rows.filter(created_at__lt=flt.created_before)
    if flt.tenant:
        rows = rows.filter(tenant__slug=flt.tenant)
    if flt.attributes:
        rows = _with_attributes(rows, shape, flt.attributes)
    return rows


def _with_attributes(rows: QuerySet[Any], shape: Shape, attributes: dict[str, str]) -> QuerySet[Any]:
    """The rows whose business attributes hold `attributes` (each a declared search field)."""
    unknown = set(attributes) - set(search_field_names())
    if unknown:
        raise InvalidInput(f"no tool declares the search field(s) {sorted(unknown)}; declared: "
                           f"{', '.join(search_field_names()) or 'none'}")
    return rows.filter(**{f"{shape.attributes}__contains": attributes})


def count(flt: Filter, user: Any) -> int:
    """The dry run: how many rows the filter selects now, counted by the database."""
    return selection(flt, user).count()


def is_money(spec: ToolSpec | None) -> bool:
    """A tool that moves money: it takes an `amount`, or a person approves its calls (an approval rule,
    as request_payment's thresholds). Acting on its records in bulk needs step-up (a fresh second factor)."""
    return spec is not None and (spec.approval is not None or "amount" in spec.input_model.model_fields)


def money_tools(rows: QuerySet[Any], target: str) -> list[str]:
    """The money tools among the selected rows' tools."""
    tools = rows.values_list(SHAPES[target].tool, flat=True).distinct()
    return sorted(name for name in tools if name and is_money(find_tool(name)))
