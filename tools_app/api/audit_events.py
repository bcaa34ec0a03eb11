"""GET /api/v1/audit-events: the append-only audit log, with its hash-chain fields.

Events are exported whole (before/after hold states, digests and
decisions, not secrets: callers of tools_app.core.audit.record_event keep it that
way), except the reason of an event a person did not write: failure messages
and agents' notes may quote the caller's data, so they are withheld exactly
as the records endpoint withholds error messages (tools_app.core.redaction).
`seq`, `prev_hash` and `hash` let an auditor check the chain's links on the
exported copy; an event whose reason is withheld can be rehashed only by the
server (`/api/v1/audit-chain/verify`). Events with no tenant (system-wide,
e.g. exports) are visible only to superusers.
"""

from __future__ import annotations

import django_filters
from rest_framework import serializers

from tools_app.access.models import Tenant
from tools_app.api.endpoints import AuditorSerializer, AuditorViewSet, tenant_filter, time_range
from tools_app.core import redaction
from tools_app.core.models import AuditEvent


class AuditEventSerializer(AuditorSerializer):
    tenant: serializers.SlugRelatedField[Tenant] = serializers.SlugRelatedField(
        slug_field="slug", read_only=True, allow_null=True, help_text="Tenant slug; null for system-wide events.")
    reason = serializers.SerializerMethodField(
        help_text=f"Why, in a person's own words; `{redaction.WITHHELD}` for text the system or an agent wrote "
                  "(failure messages may quote the caller's data; operators read it in the admin).")

    class Meta:
        model = AuditEvent
        fields = [
            "id", "seq", "created_at", "tenant", "actor", "action", "object_type", "object_id", "operation_id",
            "before", "after", "reason", "trace_id", "prev_hash", "hash",
        ]
        read_only_fields = fields

    def get_reason(self, event: AuditEvent) -> str:
        return redaction.event_reason(event.actor, event.reason)


class AuditEventFilter(django_filters.FilterSet):  # type: ignore[misc]  # django-filter ships no types
    tenant = tenant_filter()
    actor = django_filters.CharFilter(help_text="Who acted, exactly (`agent:<tenant>/<name>`, `user:<name>`, ...).")
    action = django_filters.CharFilter(help_text="Event action, exactly (e.g. `record.succeeded`).")
    object_type = django_filters.CharFilter(help_text="Model name of the object (e.g. `idempotencyrecord`).")
    object_id = django_filters.CharFilter(help_text="Primary key of the object, with `object_type`.")
    trace_id = django_filters.CharFilter(help_text="Trace id, exactly.")
    operation_id = django_filters.UUIDFilter(help_text="Every event of one operation: its record's, its task's, its "
                                                       "approval request's and its outbox events'.")
    created_after, created_before = time_range("created_at", "created")

    class Meta:
        model = AuditEvent
        fields: list[str] = []


class AuditEventViewSet(AuditorViewSet):
    """Audit events: every decision and state change, in the transaction of the change."""

    queryset = AuditEvent.objects.select_related("tenant")
    serializer_class = AuditEventSerializer
    filterset_class = AuditEventFilter
    export_name = "audit-events"
