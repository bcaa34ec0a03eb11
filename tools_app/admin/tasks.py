"""Long tasks in the admin: find stuck or failed tasks, read their step history and
checkpoints, and cancel, pause or resume them (each action goes through
tools_app.tasks, so it is guarded and audited like an agent's)."""

from django.contrib import admin, messages

from tools_app import tasks
from tools_app.errors import ToolFailure
from tools_app.models import Checkpoint, Document, StepRun, Task


class ReadOnlyInline(admin.TabularInline):
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


class StepRunInline(ReadOnlyInline):
    model = StepRun
    fields = ["step", "attempt", "worker", "outcome", "error", "started_at", "finished_at"]
    readonly_fields = fields


class CheckpointInline(ReadOnlyInline):
    model = Checkpoint
    fields = ["sequence", "step", "checksum", "input_digest", "artifact", "finished_at"]
    readonly_fields = fields


def _operator(request) -> str:
    return f"user:{request.user.get_username()}"


def _apply(modeladmin, request, queryset, verb, change):
    done = 0
    for task in queryset:
        try:
            change(task)
            done += 1
        except ToolFailure as failure:
            modeladmin.message_user(request, f"{task.pk}: {failure.message}", messages.WARNING)
    if done:
        modeladmin.message_user(request, f"{verb} {done} task(s).", messages.SUCCESS)


@admin.action(description="Cancel the selected tasks")
def cancel_tasks(modeladmin, request, queryset):
    _apply(modeladmin, request, queryset, "Cancelled",
           lambda task: tasks.cancel(task, actor=_operator(request), reason="cancelled in the admin"))


@admin.action(description="Resume the selected tasks (from their last checkpoint)")
def resume_tasks(modeladmin, request, queryset):
    _apply(modeladmin, request, queryset, "Resumed", lambda task: tasks.resume(task, actor=_operator(request)))


@admin.action(description="Pause the selected queued tasks")
def pause_tasks(modeladmin, request, queryset):
    _apply(modeladmin, request, queryset, "Paused",
           lambda task: tasks.pause(task, actor=_operator(request), reason="paused by an operator"))


@admin.register(Task)
class TaskAdmin(admin.ModelAdmin):
    list_display = ["id", "tenant", "tool", "status", "current_step", "steps", "attempts", "lease_expiries",
                    "failure_class", "updated_at"]
    list_filter = ["status", "tool", "failure_class", "tenant"]
    search_fields = ["=id", "=trace_id"]
    date_hierarchy = "created_at"
    inlines = [StepRunInline, CheckpointInline]
    actions = [cancel_tasks, resume_tasks, pause_tasks]
    exclude = ["arguments"]

    @admin.display(description="steps")
    def steps(self, task):
        return f"{len(task.completed_steps)}/{task.steps_total}"

    def get_readonly_fields(self, request, obj=None):
        return [field.name for field in Task._meta.fields if field.name != "arguments"]

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(Document)
class DocumentAdmin(admin.ModelAdmin):
    list_display = ["id", "tenant", "title", "format", "characters", "chunk_count", "created_at", "ready_at"]
    list_filter = ["format", "tenant"]
    search_fields = ["title"]
    readonly_fields = ["tenant", "task", "title", "format", "source", "content_sha256", "characters", "chunk_count",
                       "summary", "created_at", "ready_at"]

    def has_add_permission(self, request):
        return False
