"""Helpers shared by the approval tests."""

from tests.support.issued_ids import call_labelled
from tools_app.models import ApprovalRequest, AuditEvent
from tools_app.toolkit.calls import call_tool
from tools_app.toolkit.registry import get_tool

STAFF_NOTE = {"title": "Maintenance", "body": "Down at 2am", "audience": "staff"}


def call(caller, tool, **arguments):
    """call_tool; a high-risk tool's `idempotency_key` is the operation's label (tests/support/issued_ids.py)."""
    if "idempotency_key" in arguments:
        return call_labelled(caller, tool, arguments)
    return call_tool(get_tool(tool), caller, arguments)


def pending_request(result) -> ApprovalRequest:
    assert result.error is not None and result.error.error_class == "pending_approval", result.error
    return ApprovalRequest.objects.get(pk=result.error.as_dict()["approval"]["request_id"])


def actions(**filters):
    return list(AuditEvent.objects.filter(**filters).order_by("id").values_list("action", flat=True))
