"""GET /api/v1/outbox-events: messages written with business changes, and their delivery.

Exported: the event id (what consumers deduplicate by), its kind, status,
attempts and times. Not exported: the payload (recipients, subjects, bodies)
or the last error text, which may quote them.
"""

from __future__ import annotations

import django_filters
from rest_framework import serializers

from tools_app.access.models import Tenant
from tools_app.api.endpoints import AuditorSerializer, AuditorViewSet, tenant_filter, time_range
from tools_app.outbox.models import OutboxEvent, OutboxStatus


class OutboxEventSerializer(AuditorSerializer):
    tenant: serializers.SlugRelatedField[Tenant] = serializers.SlugRelatedField(slug_field="slug", read_only=True)

    class Meta:
        model = OutboxEvent
        fields = ["id", "tenant", "record", "operation_id", "kind", "status", "attempts", "next_attempt_at",
                  "created_at", "delivered_at"]
        read_only_fields = fields


class OutboxEventFilter(django_filters.FilterSet):  # type: ignore[misc]  # django-filter ships no types
    tenant = tenant_filter()
    kind = django_filters.CharFilter(help_text="Event kind, exactly (e.g. `notification.email`).")
    status = django_filters.MultipleChoiceFilter(choices=OutboxStatus.choices,
                                                 help_text="Delivery status; repeat the parameter for several.")
    operation_id = django_filters.UUIDFilter(help_text="The operation id of the call that wrote it.")
    created_after, created_before = time_range("created_at", "written")
    finished_after, finished_before = time_range("delivered_at", "delivered")

    class Meta:
        model = OutboxEvent
        fields: list[str] = []


class OutboxEventViewSet(AuditorViewSet):
    """Outbox events: delivered at least once, deduplicated by id at the consumer."""

    queryset = OutboxEvent.objects.select_related("tenant").defer("payload", "last_error")
    serializer_class = OutboxEventSerializer
    filterset_class = OutboxEventFilter
    export_name = "outbox-events"

