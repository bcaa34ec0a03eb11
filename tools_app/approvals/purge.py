"""What approval requests keep past their call's retention, and the end users' confirmation questions
once they are of no use (retention.purge calls both)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from tools_app.approvals.confirmations import Confirmation
from tools_app.approvals.models import ApprovalRequest
from tools_app.approvals.notices import public_summary


def forget_arguments(record_ids: Iterable[int]) -> int:
    """The requests of these (purged) records lose their arguments, and their summary the values of
    the personal arguments: the queue still says what was decided, by whom, for how much. Returns how many."""
    requests = list(ApprovalRequest.objects.filter(record_id__in=list(record_ids)).only("pk", "tool", "summary",
                                                                                       "arguments"))
    for request in requests:
        ApprovalRequest.objects.filter(pk=request.pk).update(arguments={}, summary=public_summary(request))
    return len(requests)


def forget_confirmations(now: datetime) -> int:
    """Delete the confirmation questions whose deadline passed: an answer to one is refused by then (its
    call asks again), and each holds the call's raw key and the words its person was shown. Who
    answered what stays in the audit log. Returns how many."""
    deleted, _ = Confirmation.objects.filter(expires_at__lt=now).delete()
    return deleted
