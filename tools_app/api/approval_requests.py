"""GET /api/v1/approval-requests: confirmation requests for sensitive operations and their outcome.

Exported: who asked, for which tool and record, the amount and currency the
thresholds were applied to, how many approvals were required and given, who
decided, why (a rejecter's reason; the failure text of a request that failed
or expired is withheld, as everywhere in the API: tools_app.core.redaction), and
when. Not exported: the arguments and the operator summary, which quote
payees and other personal data (operators read them in the admin).
"""

from __future__ import annotations

import django_filters
from rest_framework import serializers

from tools_app.access.models import Tenant
from tools_app.api.endpoints import AuditorSerializer, AuditorViewSet, tenant_filter, time_range
from tools_app.approvals.models import ApprovalRequest, ApprovalStatus
from tools_app.core import redaction


class ApprovalRequestSerializer(AuditorSerializer):
    tenant: serializers.SlugRelatedField[Tenant] = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    reason = serializers.SerializerMethodField(
        help_text=f"A rejection's reason; `{redaction.WITHHELD}` for the failure text of a request that failed "
                  "or expired.")

    class Meta:
        model = ApprovalRequest
        fields = ["id", "tenant", "tool", "record", "operation_id", "fingerprint", "status", "amount", "currency",
                  "requested_by", "required_approvals", "approvals", "decided_by", "reason", "trace_id", "created_at",
                  "decided_at", "expires_at", "finished_at"]
        read_only_fields = fields

    def get_reason(self, request: ApprovalRequest) -> str:
        # Only a rejection's reason is a person's (tools_app.approvals.reject); the others are failure texts.
        return request.reason if request.status == ApprovalStatus.REJECTED else redaction.failure_text(request.reason)


class ApprovalRequestFilter(django_filters.FilterSet):  # type: ignore[misc]  # django-filter ships no types
    tenant = tenant_filter()
    tool = django_filters.CharFilter(help_text="Tool name, exactly.")
    status = django_filters.MultipleChoiceFilter(choices=ApprovalStatus.choices,
                                                 help_text="Request status; repeat the parameter for several.")
    actor = django_filters.CharFilter(field_name="requested_by", help_text="Who asked, exactly.")
    decided_by = django_filters.CharFilter(help_text="Who approved or rejected, exactly.")
    operation_id = django_filters.UUIDFilter(help_text="The operation id of the call waiting for approval.")
    created_after, created_before = time_range("created_at", "requested")
    finished_after, finished_before = time_range("finished_at", "finished")

    class Meta:
        model = ApprovalRequest
        fields: list[str] = []


class ApprovalRequestViewSet(AuditorViewSet):
    """Confirmation requests for sensitive operations: who asked, who decided, what became of them."""

    queryset = ApprovalRequest.objects.select_related("tenant").defer("arguments", "summary")
    serializer_class = ApprovalRequestSerializer
    filterset_class = ApprovalRequestFilter
    export_name = "approval-requests"
