"""Long tasks: durable, checkpointed runs of a long tool's pipeline, resumable after any crash.

`state.py` is the task state machine (every transition one guarded function,
with its audit event); `runner.py` runs a pipeline's steps under a lease and a
heartbeat; `checkpoints.py` writes and verifies each step's checkpoint;
`control.py` is what agents and operators do (cancel, pause, resume);
`waits.py` holds durable waits (a step waiting for an event or a time, parked in the
database) and `send_event`; `versions.py` the start-up check of pipeline versions;
`forks.py` re-runs a task from step N in a new task (fork); `agent_view.py` is
how an agent starts, watches and waits for a task (start_task, a direct call
of a long tool); `hooks.py` what the outbox does for it (a finished task's
webhook); `jobs.py` the django-q2 entry points.

May import: core, access, engine, toolkit.
"""

from tools_app.tasks.agent_view import call_task_tool, describe, next_action, outcome, unfinished, wait_for
from tools_app.tasks.control import (
    CANCEL,
    MANAGE_PERMISSION,
    MARK_CAUSE_FIXED,
    PAUSE,
    RESUME,
    cancel,
    get_for_tenant,
    mark_cause_fixed,
    pause,
    resume,
)
from tools_app.tasks.forks import FORK, FORK_OPERATION, ForkHandle, fork, fork_operation
from tools_app.tasks.hooks import hooks
from tools_app.tasks.jobs import run_task, sweep
from tools_app.tasks.state import (
    ACTIVE,
    CHANGES_CHANNEL,
    RUNNABLE,
    TASK_SWEEPER,
    WEBHOOK_KIND,
    Advanced,
    begin_step,
    complete_step,
    create_task,
    expire_lease,
    fail,
    finish_step_run,
    hand_on,
    lease_seconds,
    pause_for_input,
    renew_lease,
    requeue,
    resumable,
    retry_later,
    succeed,
    take,
)
from tools_app.tasks.waits import send_event

__all__ = [
    "ACTIVE", "CANCEL", "CHANGES_CHANNEL", "FORK", "FORK_OPERATION", "MANAGE_PERMISSION", "MARK_CAUSE_FIXED", "PAUSE",
    "RESUME",
    "RUNNABLE", "TASK_SWEEPER", "WEBHOOK_KIND", "Advanced",
    "ForkHandle", "begin_step", "call_task_tool", "cancel", "complete_step",
    "create_task", "describe", "expire_lease", "fail", "finish_step_run", "fork", "fork_operation",
    "get_for_tenant", "hand_on", "hooks", "lease_seconds", "mark_cause_fixed", "next_action", "outcome", "pause",
    "pause_for_input", "renew_lease", "requeue", "resumable", "resume", "retry_later", "run_task",
    "send_event", "succeed", "sweep", "take", "unfinished", "wait_for",
]
