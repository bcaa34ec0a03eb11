"""Scheduling, pausing and resuming an operation: by an operator (the console) or the tenant's agent
(the schedule_operation tools), each authorized by access.authorize and audited."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from croniter import croniter
from django.contrib.auth.models import AnonymousUser, User
from django.db import transaction

from tools_app import access
from tools_app.access import Agent, authorize
from tools_app.core import audit, clock, db
from tools_app.core.errors import InvalidInput, NotFound
from tools_app.scheduling.models import Overlap, ScheduledOperation
from tools_app.toolkit import registry
from tools_app.toolkit.calls import validate_arguments

PERMISSION = "tools_app.manage_schedules"
SCHEDULE = access.Permit(PERMISSION, "schedule", "schedule operations", "schedule.refused", agents=True)
PAUSE = access.Permit(PERMISSION, "pause_schedule", "schedule operations", "schedule.refused", agents=True)
RESUME = access.Permit(PERMISSION, "resume_schedule", "schedule operations", "schedule.refused", agents=True)

MAX_BACKFILL = 100
# A cron rule may have a sixth field, seconds (croniter's default: last).
_CRON_FIELDS = (5, 6)


def next_tick(cron: str, after: datetime) -> datetime:
    """The first time of `cron` (UTC) strictly after `after`."""
    tick: datetime = croniter(cron, after).get_next(datetime)
    return tick


def check_cron(cron: str) -> None:
    if len(cron.split()) not in _CRON_FIELDS or not croniter.is_valid(cron):
        raise InvalidInput(f"cron: {cron!r} is not a cron rule (5 fields, or 6 with seconds last; UTC)")


def schedule(who: Agent | User | AnonymousUser, tenant_id: int, tool: str, arguments: dict[str, Any], *, cron: str = "",
             run_at: datetime | None = None, overlap: str = Overlap.SKIP, backfill: int = 0) -> ScheduledOperation:
    """A new scheduled operation: `tool` called with `arguments` once at `run_at`, or on `cron`."""
    row = ScheduledOperation(tenant_id=tenant_id, tool=tool, arguments=arguments, cron=(cron or "").strip(),
                             run_at=run_at, overlap=overlap, backfill=backfill)
    actor = authorize(who, SCHEDULE, row)
    check_arguments(row)
    now = clock.read()
    row.created_by, row.created_at = actor, now
    row.next_tick_at = next_tick(row.cron, now) if row.cron else row.run_at
    with transaction.atomic():
        row.save()
        audit.record_event(action="schedule.created", obj=row, actor=actor,
                           after={"tool": tool, "cron": row.cron, "run_at": run_at.isoformat() if run_at else None,
                                  "overlap": overlap, "backfill": backfill})
    return row


def check_arguments(row: ScheduledOperation) -> None:
    """Refuse (invalid_input) what cannot be scheduled: the tool, its arguments, the rule."""
    spec = registry.get_tool(row.tool)
    if not spec.writes or spec.requires_operation_id:
        raise InvalidInput(f"tool: {row.tool} cannot be scheduled (only write tools whose key the caller chooses)")
    if not isinstance(row.arguments, dict) or "idempotency_key" in row.arguments:
        raise InvalidInput("arguments: an object without idempotency_key (each occurrence gets its own key)")
    validate_arguments(spec, {**row.arguments, "idempotency_key": "schedule-check"})
    if bool(row.cron) == (row.run_at is not None):
        raise InvalidInput("give either cron or run_at")
    if row.cron:
        check_cron(row.cron)
    if row.overlap not in Overlap.values:
        raise InvalidInput(f"overlap: one of {', '.join(Overlap.values)}")
    if not 0 <= row.backfill <= MAX_BACKFILL:
        raise InvalidInput(f"backfill: between 0 and {MAX_BACKFILL}")


def get_for_tenant(tenant_id: int, schedule_id: int) -> ScheduledOperation:
    """Another tenant's schedule is not found, exactly like one that does not exist."""
    row = ScheduledOperation.objects.filter(tenant_id=tenant_id, pk=schedule_id).first()
    if row is None:
        raise NotFound(f"schedule_id: no schedule {schedule_id}")
    return row


def pause(row: ScheduledOperation, who: Agent | User | AnonymousUser, *, reason: str = "") -> ScheduledOperation:
    """No tick of it comes due while paused (a run already started finishes)."""
    actor = authorize(who, PAUSE, row)
    db.transition(row, {"paused": False}, {"paused": True}, action="schedule.paused", actor=actor, reason=reason,
                  before={"paused": False}, after={"paused": True})
    row.refresh_from_db()
    return row


def resume(row: ScheduledOperation, who: Agent | User | AnonymousUser, *, reason: str = "") -> ScheduledOperation:
    """Ticks come due again; those missed while paused are not run (the next is after now)."""
    actor = authorize(who, RESUME, row)
    now = clock.read()
    changes: dict[str, object] = {"paused": False}
    if row.cron:
        changes["next_tick_at"] = next_tick(row.cron, now)
    db.transition(row, {"paused": True}, changes, action="schedule.resumed", actor=actor, reason=reason,
                  before={"paused": True}, after={"paused": False})
    row.refresh_from_db()
    return row


def key_of(row: ScheduledOperation, tick_at: datetime) -> str:
    """The idempotency key of one occurrence: the schedule and the tick (UTC, to the microsecond)."""
    return f"schedule-{row.pk}-{tick_at.astimezone(UTC).strftime('%Y%m%dT%H%M%S.%fZ')}"
