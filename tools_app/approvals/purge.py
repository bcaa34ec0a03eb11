"""What approval requests keep past their call's retention (retention.purge calls it in its batch)."""

from __future__ import annotations

from collections.abc import Iterable

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
