"""The page an approver's one-click link opens (tools_app.approvals.links): the request and its decision.

The console's login comes first (admin_view: a person not logged in is sent to the login page and back
here), then the second factor (a session that entered no code is sent to the second-factor page and back);
then the link is checked (signed, this person's, unused, unexpired) and the page shows what the request
would do with Approve and Reject. Opening the page decides nothing (a mail scanner that follows links
changes nothing); the POST of one of its buttons decides, through approvals.links.decide, once. An approval
above the tenant's step-up amount with an older code goes to the second-factor page and back here.
A refused link answers 403 with its message and changes nothing.
"""

from __future__ import annotations

from typing import Any

from django.contrib.admin import AdminSite
from django.contrib.auth.models import User
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse

from tools_app.access import second_factor
from tools_app.admin.operator_actions import second_factor_page
from tools_app.approvals import links, notices
from tools_app.approvals.models import ApprovalStatus, ApprovalVerdict
from tools_app.core.errors import Refused

TEMPLATE = "admin/tools_app/approval_decide.html"


def decide_view(site: AdminSite) -> Any:
    def view(request: HttpRequest, token: str) -> HttpResponse:
        user = request.user
        assert isinstance(user, User)  # admin_view lets only signed-in staff here
        if not second_factor.verified(user):
            return HttpResponseRedirect(second_factor_page(request.get_full_path()))
        context: dict[str, Any] = {**site.each_context(request), "title": "Approval request"}
        try:
            link = links.check(token, user)
        except links.LinkRefused as refused:
            return TemplateResponse(request, TEMPLATE, {**context, "refused": refused.reason}, status=403)
        approval = link.request
        context.update(approval=approval, summary=notices.public_summary(approval), verdicts=ApprovalVerdict,
                       pending=approval.status == ApprovalStatus.PENDING)
        if request.method == "POST":
            verdict = request.POST.get("verdict", "")
            if verdict not in ApprovalVerdict.values:
                return TemplateResponse(request, TEMPLATE, {**context, "error": "Choose Approve or Reject."},
                                        status=400)
            try:
                decided = links.decide(token, user, verdict, request.POST.get("reason", ""))
            except second_factor.StaleSecondFactor:
                return HttpResponseRedirect(second_factor_page(request.get_full_path(), stale=True))
            except links.LinkRefused as refused:
                return TemplateResponse(request, TEMPLATE, {**context, "refused": refused.reason}, status=403)
            except Refused as refused:  # the decision's rules: four eyes, a reason, no longer pending, ...
                return TemplateResponse(request, TEMPLATE, {**context, "error": refused.reason}, status=409)
            return TemplateResponse(request, TEMPLATE, {**context, "approval": decided, "pending": False,
                                                        "done": _done(decided.status, decided)})
        return TemplateResponse(request, TEMPLATE, context)

    return view


def _done(status: str, decided: Any) -> str:
    if status == ApprovalStatus.APPROVED:
        return "Approved: it is being executed."
    if status == ApprovalStatus.REJECTED:
        return "Rejected: it will not run, and the agent is told why."
    return f"Your approval is counted ({decided.approvals} of {decided.required_approvals})."
