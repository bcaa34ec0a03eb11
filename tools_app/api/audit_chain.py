"""GET /api/v1/audit-chain/verify: check the audit hash chain over a range of seq, a page at a time.

One request checks at most IDEMOPS_AUDIT_VERIFY_PAGE_EVENTS events; its `next`
cursor (signed: the seq to continue from, the hash reached, the range's end)
continues the walk from the hash this page computed, so following every page
checks the range as one walk would.

The chain spans every tenant (one sequence), so a tenant-scoped auditor may
verify links it cannot read: the report names the broken seq and the
problem, and the event id only when the caller may see that event.
"""

from __future__ import annotations

from typing import Any

from django.core import signing
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from tools_app import access
from tools_app.api.auth import IsAuditor
from tools_app.api.endpoints import ERROR_RESPONSES, FILTER_ERROR_RESPONSE, AuditorSchema, AuditorViewSet
from tools_app.conf import conf
from tools_app.core import audit
from tools_app.core.models import AuditEvent

CURSOR_SALT = "tools_app.api.audit_chain.cursor"


class ChainRangeSerializer(serializers.Serializer[dict[str, Any]]):
    from_seq = serializers.IntegerField(min_value=1, required=False, default=1,
                                        help_text="First seq to check (default 1).")
    to_seq = serializers.IntegerField(min_value=1, required=False, default=None, allow_null=True,
                                      help_text="Last seq to check (default: the newest sealed event).")
    limit = serializers.IntegerField(min_value=1, required=False, default=None, allow_null=True,
                                     help_text="Most events to check in this request (at most, and by default, "
                                               "IDEMOPS_AUDIT_VERIFY_PAGE_EVENTS).")
    cursor = serializers.CharField(required=False, default=None, allow_null=True,
                                   help_text="The previous answer's `next`: continue its walk (from_seq and to_seq "
                                             "are then taken from it).")

    def validate_limit(self, limit: int | None) -> int:
        most = conf().audit_verify_page_events
        if limit is not None and limit > most:
            raise serializers.ValidationError(f"at most {most} events per request; follow `next` for the rest")
        return limit or most

    def validate_cursor(self, cursor: str | None) -> dict[str, Any] | None:
        if cursor is None:
            return None
        try:
            position: dict[str, Any] = signing.loads(cursor, salt=CURSOR_SALT)
        except signing.BadSignature:
            raise serializers.ValidationError(
                "not a cursor this server issued (copy `next` from the previous answer unchanged)") from None
        return position

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        position = attrs.pop("cursor")
        if position is not None:
            attrs.update(from_seq=position["from_seq"], to_seq=position["to_seq"], start_hash=position["hash"])
        return attrs


def cursor(report: audit.ChainReport, to_seq: int | None) -> str | None:
    if report.next_seq is None:
        return None
    return signing.dumps({"from_seq": report.next_seq, "to_seq": to_seq, "hash": report.head_hash},
                         salt=CURSOR_SALT)


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
    next = serializers.CharField(allow_null=True, help_text="A cursor to continue the walk (pass it as `cursor`); "
                                                            "null when the range is done or a link is broken.")


class AuditChainVerifyView(APIView):
    """Verify the audit log's hash chain over a range of seq, a bounded page at a time, and report the first
    broken link."""

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
        next_page = cursor(report, params.validated_data["to_seq"])
        broken = report.broken
        if broken is not None and broken.event_id is not None and not _visible(request.user, broken.event_id):
            broken = audit.BrokenLink(broken.seq, None, broken.problem)
        return Response(ChainReportSerializer({
            "ok": report.ok, "verified": report.verified, "head_seq": report.head_seq,
            "head_hash": report.head_hash, "unsealed": report.unsealed, "broken": broken,
            "next": next_page}).data)


def _visible(user: object, event_id: int) -> bool:
    return access.scope(AuditEvent.objects.filter(pk=event_id), user).exists()
