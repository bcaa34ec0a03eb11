"""GET /api/v1/audit-chain/verify: check the audit hash chain over a range of seq.

The chain spans every tenant (one sequence), so a tenant-scoped auditor may
verify links it cannot read: the report names the broken seq and the
problem, and the event id only when the caller may see that event.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from tools_app import access
from tools_app.api.auth import IsAuditor
from tools_app.api.endpoints import ERROR_RESPONSES, FILTER_ERROR_RESPONSE, AuditorSchema, AuditorViewSet
from tools_app.core import audit
from tools_app.core.models import AuditEvent


class ChainRangeSerializer(serializers.Serializer[dict[str, Any]]):
    from_seq = serializers.IntegerField(min_value=1, required=False, default=1,
                                        help_text="First seq to check (default 1).")
    to_seq = serializers.IntegerField(min_value=1, required=False, default=None, allow_null=True,
                                      help_text="Last seq to check (default: the newest sealed event).")


class BrokenLinkSerializer(serializers.Serializer[audit.BrokenLink]):
    seq = serializers.IntegerField(help_text="seq of the first broken link.")
    event_id = serializers.IntegerField(allow_null=True, help_text="The event's id, if you may see that event.")
    problem = serializers.CharField(help_text="What is wrong: edited content, changed link, missing events, ...")


class ChainReportSerializer(serializers.Serializer[dict[str, Any]]):
    ok = serializers.BooleanField(help_text="True when every link in the range holds.")
    verified = serializers.IntegerField(help_text="Events whose links were checked.")
    head_seq = serializers.IntegerField(help_text="The last seq checked.")
    head_hash = serializers.CharField(help_text="Its hash: keep it somewhere the database owner cannot write.")
    unsealed = serializers.IntegerField(help_text="Events committed but not yet linked (sealed every minute).")
    broken = BrokenLinkSerializer(allow_null=True, help_text="The first broken link, or null.")


class AuditChainVerifyView(APIView):
    """Verify the audit log's hash chain over a range of seq and report the first broken link."""

    authentication_classes = AuditorViewSet.authentication_classes
    permission_classes = [IsAuditor]
    schema = AuditorSchema()

    @extend_schema(parameters=[ChainRangeSerializer],
                   responses={200: ChainReportSerializer, **ERROR_RESPONSES, **FILTER_ERROR_RESPONSE},
                   operation_id="audit_chain_verify")
    def get(self, request: Request) -> Response:
        params = ChainRangeSerializer(data=request.query_params)
        params.is_valid(raise_exception=True)
        report = audit.verify_chain(**params.validated_data)
        broken = report.broken
        if broken is not None and broken.event_id is not None and not _visible(request.user, broken.event_id):
            broken = audit.BrokenLink(broken.seq, None, broken.problem)
        return Response(ChainReportSerializer({
            "ok": report.ok, "verified": report.verified, "head_seq": report.head_seq,
            "head_hash": report.head_hash, "unsealed": report.unsealed, "broken": broken}).data)


def _visible(user: object, event_id: int) -> bool:
    return access.scope(AuditEvent.objects.filter(pk=event_id), user).exists()
