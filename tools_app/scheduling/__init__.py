"""Scheduled and delayed operations: a tool call an operator or an agent schedules once at a time or
on a cron rule (croniter, UTC), run by the job cluster.

- `models.py`: ScheduledOperation (tool, arguments, cron or run_at, overlap policy, backfill, paused,
  next tick) and ScheduledRun (one occurrence: its tick, its idempotency key, its outcome).
- `operations.py`: schedule, pause, resume: by an operator (the console) or the tenant's agent (MCP
  tools), each through access.authorize and audited.
- `jobs.py`: the cluster's loop (tools_app.schedules runs `tick` every IDEMOPS_SCHEDULE_TICK_SECONDS):
  due ticks become runs, runs call the tool through toolkit.calls.call_tool, as an agent's call would,
  with the key `schedule-<id>-<tick>`: a tick found twice runs once (the engine's claim of that key).

Not tools_app/schedules.py: that module declares the platform's own periodic jobs (this one's loop
among them).

May import: toolkit (the registry, call_tool), access, engine, core. Nothing imports it but the tools,
the admin, the schedules module and the models module.
"""

from tools_app.scheduling.models import Overlap, RunStatus, ScheduledOperation, ScheduledRun
from tools_app.scheduling.operations import PAUSE, RESUME, SCHEDULE, get_for_tenant, pause, resume, schedule

__all__ = ["PAUSE", "RESUME", "SCHEDULE", "Overlap", "RunStatus", "ScheduledOperation", "ScheduledRun",
           "get_for_tenant", "pause", "resume", "schedule"]
