"""GET /api/v1/tasks and /api/v1/checkpoints: long tasks and the checkpoints they resumed from.

Exported: the task's state machine fields (status, steps, attempts, lease
expiries, failure class), its input digest and times, and the task it
re-runs if it is a fork (forked_from, forked_at_step); each checkpoint's
step, sequence, input digest and checksum. Not exported: the arguments, the
result, step outputs and failure texts, which may hold document content;
the digests and checksums prove what ran on what without revealing it.
"""

from __future__ import annotations

import django_filters
from django.db.models import Prefetch
from rest_framework import serializers

from tools_app.access.models import Tenant
from tools_app.api.endpoints import AuditorSerializer, AuditorViewSet, tenant_filter, time_range
from tools_app.core.errors import ErrorClass
from tools_app.tasks.models import Checkpoint, Task, TaskStatus

TASK_CONTENT = ("arguments", "result", "input_request", "resume_input", "notify_url")


class CheckpointSerializer(AuditorSerializer):
    tenant = serializers.CharField(source="task.tenant.slug", read_only=True, help_text="The task's tenant.")

    class Meta:
        model = Checkpoint
        fields = ["id", "tenant", "task", "sequence", "step", "input_digest", "checksum", "finished_at"]
        read_only_fields = fields


class TaskSerializer(AuditorSerializer):
    tenant: serializers.SlugRelatedField[Tenant] = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    failure_class = serializers.ChoiceField(choices=ErrorClass.choices, allow_blank=True, read_only=True,
                                            help_text="What an agent could do about the failure; empty unless failed.")
    checkpoints = CheckpointSerializer(many=True, read_only=True)

    class Meta:
        model = Task
        fields = ["id", "tenant", "tool", "record", "operation_id", "status", "current_step", "completed_steps",
                  "steps_total", "attempts", "max_attempts", "lease_expiries", "failure_class", "next_retry_at",
                  "input_digest", "forked_from", "forked_at_step", "trace_id", "actor", "created_at", "updated_at",
                  "finished_at", "checkpoints"]
        read_only_fields = fields


class TaskFilter(django_filters.FilterSet):  # type: ignore[misc]  # django-filter ships no types
    tenant = tenant_filter()
    tool = django_filters.CharFilter(help_text="Tool name, exactly.")
    status = django_filters.MultipleChoiceFilter(choices=TaskStatus.choices,
                                                 help_text="Task status; repeat the parameter for several.")
    failure_class = django_filters.MultipleChoiceFilter(choices=ErrorClass.choices,
                                                        help_text="Failure class of a failed task; repeatable.")
    actor = django_filters.CharFilter(help_text="Who started it, exactly.")
    operation_id = django_filters.UUIDFilter(help_text="The operation id of the call that started it.")
    created_after, created_before = time_range("created_at", "created")
    finished_after, finished_before = time_range("finished_at", "finished")

    class Meta:
        model = Task
        fields: list[str] = []


class TaskViewSet(AuditorViewSet):
    """Long tasks, each with the checkpoints it holds."""

    # Never read what is not exported: arguments, results and step outputs can be megabytes of document.
    queryset = (Task.objects.select_related("tenant").defer(*TASK_CONTENT)
                .prefetch_related(Prefetch("checkpoints", Checkpoint.objects.defer("output_inline"))))
    serializer_class = TaskSerializer
    filterset_class = TaskFilter
    export_name = "tasks"
    # CSV cells are flat: the nested checkpoints have their own endpoint and export.
    csv_fields = [f for f in TaskSerializer.Meta.fields if f != "checkpoints"]



class CheckpointFilter(django_filters.FilterSet):  # type: ignore[misc]  # django-filter ships no types
    tenant = tenant_filter("task__tenant__slug")
    task = django_filters.UUIDFilter(help_text="Task id: that task's checkpoints.")
    finished_after, finished_before = time_range("finished_at", "finished")

    class Meta:
        model = Checkpoint
        fields: list[str] = []


class CheckpointViewSet(AuditorViewSet):
    """Checkpoints of every visible task (`?task=<id>` for one task's), in the order they were written."""

    queryset = Checkpoint.objects.select_related("task__tenant").defer(
        "output_inline", *(f"task__{name}" for name in TASK_CONTENT))
    serializer_class = CheckpointSerializer
    filterset_class = CheckpointFilter
    tenant_field = "task__tenant_id"
    ordering_fields = ["finished_at"]
    ordering = ["-finished_at"]
    export_name = "checkpoints"
