"""What is stuck right now, read from the rows themselves when asked (a scrape, a dashboard view):
UNKNOWN records, leases overrun, unfinished tasks by status, outbox events by status and the
oldest one waiting, approval requests waiting and the oldest of them; and, for /metrics, each
downstream's circuit breaker and the operators' pauses by scope (`incidents_now`). Each is one grouped count
over an index; nothing is cached, so `/metrics` and the dashboard read the same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import TypeVar

from django.db.models import Count, Min, Model, QuerySet
from django.utils import timezone

from tools_app import access
from tools_app.approvals.models import ApprovalRequest, ApprovalStatus
from tools_app.engine.models import IdempotencyRecord, RecordStatus
from tools_app.incidents.models import BreakerState, Downstream, Pause
from tools_app.outbox.models import OutboxEvent, OutboxStatus
from tools_app.tasks.models import Task, TaskStatus

# Unfinished tasks; finished ones are history (the admin lists them).
LIVE_TASK_STATUSES = (TaskStatus.CREATED, TaskStatus.RUNNING, TaskStatus.PAUSED, TaskStatus.RETRYING)


@dataclass
class Now:
    at: datetime
    unknown: dict[str, int] = field(default_factory=dict)  # tool -> records UNKNOWN
    overrun: dict[str, int] = field(default_factory=dict)  # tool -> records PROCESSING past their lease
    tasks: dict[tuple[str, str], int] = field(default_factory=dict)  # (tool, status) -> unfinished tasks
    outbox: dict[str, int] = field(default_factory=dict)  # status -> events
    outbox_oldest_pending: datetime | None = None
    approvals_waiting: dict[str, int] = field(default_factory=dict)  # tool -> pending requests
    approvals_oldest: dict[str, datetime] = field(default_factory=dict)  # tool -> oldest pending request

    def age(self, moment: datetime | None) -> float | None:
        return None if moment is None else max(0.0, (self.at - moment).total_seconds())


def now_age(moment: datetime | None) -> float:
    """Seconds since `moment` by this process's clock (0: none)."""
    return 0.0 if moment is None else max(0.0, (timezone.now() - moment).total_seconds())


M = TypeVar("M", bound=Model)


def _scoped(queryset: QuerySet[M], viewer: object | None) -> QuerySet[M]:
    return queryset if viewer is None else access.scope(queryset, viewer)


def now(viewer: object | None = None, at: datetime | None = None) -> Now:
    """The figures of the tenants `viewer` may see (None: all of them, for /metrics)."""
    at = at or timezone.now()
    figures = Now(at=at)
    records = _scoped(IdempotencyRecord.objects.all(), viewer)
    figures.unknown = dict(records.filter(status=RecordStatus.UNKNOWN).values_list("tool").annotate(n=Count("id")))
    figures.overrun = dict(records.filter(status=RecordStatus.PROCESSING, lease_expires_at__lt=at)
                           .values_list("tool").annotate(n=Count("id")))
    tasks = _scoped(Task.objects.filter(status__in=LIVE_TASK_STATUSES), viewer)
    figures.tasks = {(tool, status): n for tool, status, n in
                     tasks.values_list("tool", "status").annotate(n=Count("id")).order_by()}
    events = _scoped(OutboxEvent.objects.all(), viewer)
    figures.outbox = dict(events.values_list("status").annotate(n=Count("id")).order_by())
    figures.outbox_oldest_pending = events.filter(status=OutboxStatus.PENDING).aggregate(
        oldest=Min("created_at"))["oldest"]
    pending = _scoped(ApprovalRequest.objects.filter(status=ApprovalStatus.PENDING), viewer)
    for tool, n, oldest in pending.values_list("tool").annotate(n=Count("id"), oldest=Min("created_at")).order_by():
        figures.approvals_waiting[tool], figures.approvals_oldest[tool] = n, oldest
    return figures


@dataclass
class Incidents:
    breakers: dict[str, str] = field(default_factory=dict)  # downstream -> its breaker's state, as stored
    pauses: dict[str, int] = field(default_factory=dict)  # scope -> pauses standing

    def holding(self, downstream: str) -> bool:
        """Whether `downstream`'s breaker holds calls back (open, or one call probing): a state that
        is not one of the breaker's (a corrupt row) holds nothing back, as the gate reads it."""
        return self.breakers.get(downstream) in (BreakerState.OPEN, BreakerState.PROBING)


def incidents_now() -> Incidents:
    """The platform's breakers and pauses (no tenant's: a tenant's pause counts in its scope only)."""
    return Incidents(breakers=dict(Downstream.objects.values_list("name", "state")),
                     pauses=dict(Pause.objects.values_list("scope").annotate(n=Count("id")).order_by()))
