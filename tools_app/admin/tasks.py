"""Long tasks in the admin: find stuck or failed tasks, read their step history,
checkpoints and audit trail, and cancel, pause, resume or fork them (re-run from a step).

Each action goes through tools_app.tasks (guarded, audited like an agent's),
which checks the manage_task permission and the tenant itself.
"""

from __future__ import annotations

import uuid
from typing import TypeVar

from django import forms
from django.contrib import admin
from django.db.models import Q, QuerySet
from django.http import HttpRequest

from tools_app import tasks
from tools_app.admin import story as stories
from tools_app.admin.big_lists import DateRangeFilter, RecentValuesFilter, TenantFilter
from tools_app.admin.generic import ModelAdmin, ModelT, TabularInline
from tools_app.admin.operator_actions import (
    REASON_OPTIONAL,
    REASON_REQUIRED,
    OperatorAction,
    OperatorActionsAdmin,
    QueueAdmin,
    age,
    pretty_json,
)
from tools_app.admin.scoping import ListedFromReplica, ReadOnlyAdmin, TenantScopedAdmin
from tools_app.core import clock, redaction
from tools_app.core.errors import ToolFailure
from tools_app.tasks.models import Checkpoint, StepRun, Task, TaskNeedingAttention, TaskStatus
from tools_app.toolkit.registry import all_tools

TaskT = TypeVar("TaskT", bound=Task)  # a task page shows every task, or the queue's (a proxy)


class ReadOnlyInline(TabularInline[ModelT, Task]):
    extra = 0
    can_delete = False
    show_change_link = False

    def has_add_permission(self, request: HttpRequest, obj: Task | None = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Task | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Task | None = None) -> bool:
        return False


class StepRunInline(ReadOnlyInline[StepRun]):
    model = StepRun
    verbose_name_plural = "step runs (one row per start of a step)"
    fields = readonly_fields = ("step", "attempt", "worker", "outcome", "error", "started_at", "finished_at")


class CheckpointInline(ReadOnlyInline[Checkpoint]):
    model = Checkpoint
    fields = readonly_fields = ("sequence", "step", "checksum", "input_digest", "artifact", "finished_at")


def cancel(request: HttpRequest, task: Task, reason: str) -> str:
    tasks.cancel(task, request.user, reason=reason)
    return "cancelled; a step still running stops at its next heartbeat"


def resume(request: HttpRequest, task: Task, reason: str) -> str:
    task = tasks.resume(task, request.user)
    return f"now {task.status}"


def mark_cause_fixed(request: HttpRequest, task: Task, reason: str) -> str:
    tasks.mark_cause_fixed(task, request.user, reason=reason)
    return "its cause is marked fixed; Resume (or the agent's resume_task) runs it again"


def pause(request: HttpRequest, task: Task, reason: str) -> str:
    task = tasks.pause(task, request.user, reason=reason)
    if task.status == TaskStatus.RUNNING:
        return "asked to pause: it pauses when its current step is done; resume it to go on"
    return "paused; resume it to queue it again"


def fork(request: HttpRequest, task: Task, reason: str, from_step: str, form_key: str) -> str:
    # One key per form and task: the same form sent twice forks once.
    new = tasks.fork_operation(task, request.user, from_step=from_step, reason=reason,
                               key=f"admin-fork:{form_key}:{task.pk}")
    return f"forked as task {new.pk}, running again from step {from_step!r}"


def step_choices() -> list[tuple[str, list[tuple[str, str]]]]:
    """Every long tool's steps, grouped by tool, in order (the task's own tool is checked when forking)."""
    return [(spec.name, [(step.name, step.name) for step in spec.pipeline.steps])
            for spec in all_tools() if spec.pipeline is not None]


class TaskPage(ModelAdmin[TaskT]):
    """What both task pages show and do: the record of a task and the operator actions on it."""

    fields = readonly_fields = (
        "tenant", "tool", "status", "current_step", "completed_steps", "steps_total", "progress_done", "progress_total",
        "progress_message", "attempts", "max_attempts", "lease_expiries", "failure_class", "failure_reason",
        "cause_fixed_at", "pause_reason", "pause_requested", "input_request_display", "next_retry_at", "lease_owner",
        "lease_expires_at", "version", "input_digest", "result_display", "forked_from", "forked_at_step",
        "forks_display", "notify_url_display", "trace_id", "actor", "enqueued_at", "created_at", "updated_at",
        "finished_at", "story",
    )
    inlines = [StepRunInline, CheckpointInline]
    list_select_related = ["tenant"]
    search_fields = ["=id", "=trace_id"]
    operator_actions = [
        OperatorAction("cancel", "Cancel", tasks.CANCEL, cancel, refused=(ToolFailure,), reason=REASON_OPTIONAL,
                       style="danger", help_text="No further step starts; the task cannot be resumed."),
        OperatorAction("resume", "Resume", tasks.RESUME, resume, refused=(ToolFailure,),
                       help_text="Continues from the last valid checkpoint (paused, retrying, transiently "
                                 "failed, failed with internal_error whose cause is marked fixed, or a dead "
                                 "worker's task)."),
        OperatorAction("mark_cause_fixed", "Mark cause fixed", tasks.MARK_CAUSE_FIXED, mark_cause_fixed,
                       refused=(ToolFailure,), reason=REASON_REQUIRED,
                       help_text="For a task failed with internal_error (a bug): what fixed it, e.g. the release. "
                                 "Resume then runs it again from its last checkpoint."),
        OperatorAction("pause", "Pause", tasks.PAUSE, pause, refused=(ToolFailure,), reason=REASON_REQUIRED,
                       help_text="Why it must wait. A queued or retrying task pauses at once; a running one when "
                                 "its current step is done (the step is not cut short)."),
        OperatorAction("fork", "Fork from a step", tasks.FORK, fork, refused=(ToolFailure,),
                       reason=REASON_REQUIRED,
                       help_text="Why it must run again. A new task re-runs this task's pipeline from the chosen "
                                 "step, reusing the verified checkpoints before it; this task is left as it is.",
                       extra_fields={
                           "from_step": forms.ChoiceField(choices=step_choices,
                                                          help_text="The first step to run again."),
                           "form_key": forms.CharField(widget=forms.HiddenInput, initial=lambda: uuid.uuid4().hex,
                                                       max_length=32),
                       }),
    ]

    @admin.display(description="steps")
    def steps(self, task: TaskT) -> str:
        return f"{len(task.completed_steps)}/{task.steps_total}"

    @admin.display(description="last update", ordering="updated_at")
    def last_update(self, task: TaskT) -> str:
        return f"{age(task.updated_at)} ago"

    @admin.display(description="input request")
    def input_request_display(self, task: TaskT) -> str:
        return pretty_json(task.input_request) if task.input_request else "—"

    @admin.display(description="result")
    def result_display(self, task: TaskT) -> str:
        return pretty_json(task.result) if task.result is not None else "—"

    @admin.display(description="notify url")
    def notify_url_display(self, task: TaskT) -> str:
        # Without its query: a webhook's token is for the relay, not for the screen.
        return redaction.public_url(task.notify_url) if task.notify_url else "—"

    @admin.display(description="forks (re-runs of this task)")
    def forks_display(self, task: TaskT) -> str:
        forks = list(task.forks.order_by("created_at").values_list("pk", "forked_at_step", "status"))
        return "; ".join(f"{pk} from {step} ({status})" for pk, step, status in forks) or "—"

    @admin.display(description="story")
    def story(self, task: TaskT) -> str:
        # The operation that started it (its record, approval) and every step, checkpoint and audit event.
        return stories.render(task)


@admin.register(Task)
class TaskAdmin(TaskPage[Task], ListedFromReplica[Task], OperatorActionsAdmin[Task], TenantScopedAdmin[Task],
                ReadOnlyAdmin[Task]):
    """Every task, any status."""

    list_display = ["id", "tenant", "tool", "status", "current_step", "steps", "attempts", "lease_expiries",
                    "failure_class", "last_update"]
    list_filter = ["status", ("tool", RecentValuesFilter), ("failure_class", RecentValuesFilter),
                   ("tenant", TenantFilter), ("created_at", DateRangeFilter), ("finished_at", DateRangeFilter)]


def needs_attention() -> Q:
    """Failed, paused, backing off, or running on an expired lease (its worker died)."""
    return (Q(status__in=[TaskStatus.FAILED, TaskStatus.PAUSED, TaskStatus.RETRYING])
            | Q(status=TaskStatus.RUNNING, lease_expires_at__lt=clock.NOW))


@admin.register(TaskNeedingAttention)
class TaskQueueAdmin(TaskPage[TaskNeedingAttention], QueueAdmin[TaskNeedingAttention]):
    """The queue of tasks a person may need to look at, longest untouched first."""

    list_display = ["id", "flag", "tenant", "tool", "status", "current_step", "steps", "attempts", "lease_expiries",
                    "failure_class", "waiting"]
    list_filter = ["status", "tool", "failure_class", ("tenant", admin.RelatedOnlyFieldListFilter)]
    ordering = ["updated_at", "pk"]
    age_field = "updated_at"
    stands_out_label = "failed or worker died"
    what_to_do = ("Long tasks that failed, are paused (waiting for a person or input), are backing off, or whose "
                  "worker died. Open one to read its steps, checkpoints, error and audit trail. Resume continues "
                  "from the last valid checkpoint (finished steps do not run again); Pause holds a queued or "
                  "retrying task; Cancel stops it for good.")

    def get_queryset(self, request: HttpRequest) -> QuerySet[TaskNeedingAttention]:
        return super().get_queryset(request).filter(needs_attention())

    def standing_out(self) -> Q:
        return Q(status=TaskStatus.FAILED) | Q(status=TaskStatus.RUNNING, lease_expires_at__lt=clock.NOW)

    @admin.display(description="since last update", ordering="updated_at")
    def waiting(self, task: TaskNeedingAttention) -> str:
        return age(task.updated_at)
