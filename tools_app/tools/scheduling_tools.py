"""Scheduled operations for agents: schedule_operation, pause_schedule, resume_schedule, get_schedule.

Thin declarations over tools_app.scheduling. Schedule ids are bound to the tenant: another tenant's
id is `not_found`, exactly like an id that does not exist.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import AwareDatetime, BaseModel, Field

from tools_app import scheduling
from tools_app.access import Agent
from tools_app.scheduling.operations import MAX_BACKFILL
from tools_app.toolkit.registry import ObjectId, ToolContext, ToolInput, WriteInput, read_tool, write_tool

RECENT_RUNS = 20


class ScheduleInput(WriteInput):
    tool: str = Field(min_length=1, max_length=100, description="The write tool to call, by its name in tools/list.")
    arguments: dict[str, Any] = Field(
        default_factory=dict, description="Its arguments, without idempotency_key: each occurrence is called with "
                                          "its own key, schedule-<schedule id>-<tick time>.")
    cron: str | None = Field(None, max_length=120, description="A cron rule in UTC (5 fields, or 6 with seconds "
                                                               "last), e.g. '0 6 * * 1-5'. Or run_at.")
    run_at: AwareDatetime | None = Field(None, description="Call it once, at this time (with its offset). Or cron.")
    overlap: Literal["skip", "queue"] = Field("skip", description="A tick while the previous occurrence still "
                                                                  "runs: skip it, or queue it to run after.")
    backfill: int = Field(0, ge=0, le=MAX_BACKFILL, description="After an outage of the scheduler, how many of the "
                                                                "missed ticks (the latest) still run.")


class ScheduleRef(WriteInput):
    schedule_id: ObjectId
    reason: str = Field("", max_length=500)


class ScheduleLookup(ToolInput):
    schedule_id: ObjectId


class RunView(BaseModel):
    tick_at: datetime
    idempotency_key: str
    status: str
    outcome: str
    error_class: str
    operation_id: str | None


class ScheduleView(BaseModel):
    schedule_id: int
    tool: str
    cron: str | None
    run_at: datetime | None
    overlap: str
    backfill: int
    paused: bool
    next_tick_at: datetime | None = Field(description="Null once a one-time operation has come due.")
    recent_runs: list[RunView] = Field(description=f"Its latest {RECENT_RUNS} occurrences, newest first.")


def describe(row: scheduling.ScheduledOperation) -> ScheduleView:
    runs = [RunView(tick_at=run.tick_at, idempotency_key=run.key, status=run.status, outcome=run.outcome,
                    error_class=run.error_class, operation_id=str(run.operation_id) if run.operation_id else None)
            for run in row.runs.order_by("-tick_at")[:RECENT_RUNS]]
    return ScheduleView(schedule_id=row.pk, tool=row.tool, cron=row.cron or None, run_at=row.run_at,
                        overlap=row.overlap, backfill=row.backfill, paused=row.paused,
                        next_tick_at=row.next_tick_at, recent_runs=runs)


@write_tool(name="schedule_operation", title="Schedule a tool call", personal_fields=frozenset({"arguments"}))
def schedule_operation(ctx: ToolContext, args: ScheduleInput) -> ScheduleView:
    """Schedule a write tool's call: once at run_at, or on a cron rule (UTC). Each occurrence is called with its
    own idempotency key (schedule-<id>-<tick>), so an occurrence never runs twice; get_schedule shows each one's
    outcome and operation id. Requires idempotency_key: a retry returns the same schedule."""
    row = scheduling.schedule(Agent(ctx.tenant_id, ctx.actor), ctx.tenant_id, args.tool, args.arguments,
                              cron=args.cron or "", run_at=args.run_at, overlap=args.overlap, backfill=args.backfill)
    return describe(row)


@write_tool(name="pause_schedule", title="Pause a schedule",
            personal_fields=frozenset({"reason"}))
def pause_schedule(ctx: ToolContext, args: ScheduleRef) -> ScheduleView:
    """Pause a scheduled operation: no occurrence comes due until resume_schedule (one already running finishes)."""
    row = scheduling.get_for_tenant(ctx.tenant_id, args.schedule_id)
    return describe(scheduling.pause(row, Agent(ctx.tenant_id, ctx.actor), reason=args.reason))


@write_tool(name="resume_schedule", title="Resume a schedule",
            personal_fields=frozenset({"reason"}))
def resume_schedule(ctx: ToolContext, args: ScheduleRef) -> ScheduleView:
    """Resume a paused scheduled operation from its next tick after now (ticks missed while paused do not run)."""
    row = scheduling.get_for_tenant(ctx.tenant_id, args.schedule_id)
    return describe(scheduling.resume(row, Agent(ctx.tenant_id, ctx.actor), reason=args.reason))


@read_tool(name="get_schedule", title="A scheduled operation",
           personal_fields=frozenset())
def get_schedule(ctx: ToolContext, args: ScheduleLookup) -> ScheduleView:
    """A scheduled operation of this tenant: its rule, whether it is paused, its next tick and its latest
    occurrences with their outcomes."""
    return describe(scheduling.get_for_tenant(ctx.tenant_id, args.schedule_id))
