"""The confirmation page: where the person behind an agent confirms or declines a call their MCP host could
not ask them about (tools_app.approvals.confirmations). Behind their login; only the person the agent acts
for (the owner of its token, or the person who connected it) may decide, once, before the deadline."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.middleware.csrf import get_token
from django.utils.html import format_html
from django.views.decorators.http import require_http_methods

from tools_app.access import owner_id_of
from tools_app.approvals.confirmations import Confirmation, ConfirmationStatus, decide_on_page
from tools_app.core import audit

PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>Confirm an operation · idemops</title></head>
<body><main><h1>Confirm an operation</h1><p>An agent acting for you asks to run <strong>{}</strong>:</p>
<blockquote>{}</blockquote><p>{}</p>{}</main></body></html>"""

FORM = """<form method="post"><input type="hidden" name="csrfmiddlewaretoken" value="{}">
<button name="decision" value="confirm">Confirm</button> <button name="decision" value="decline">Decline</button>
</form><p>Answer before {}. Then the agent calls again with the same key.</p>"""


@login_required
@require_http_methods(["GET", "POST"])
def confirmation_page(request: HttpRequest, token: str) -> HttpResponse:
    row = Confirmation.objects.filter(token=token).first()
    # Another person's question is not found: its summary is not theirs to read.
    if row is None or owner_id_of(row.tenant_id, row.actor) != request.user.pk:
        raise Http404("no such confirmation for you")
    status = 200
    if request.method == "POST":
        decision = request.POST.get("decision")
        if decision not in ("confirm", "decline"):
            return HttpResponse("Choose confirm or decline.", status=400)
        if not decide_on_page(row, confirmed=decision == "confirm", person=audit.user_actor(request.user)):
            status = 409
        row.refresh_from_db()
    said = {ConfirmationStatus.PENDING: "Not answered yet.",
            ConfirmationStatus.CONFIRMED: "Confirmed: it runs when the agent calls again.",
            ConfirmationStatus.ACCEPTED: "Confirmed, and run.",
            ConfirmationStatus.DECLINED: "Declined: nothing was done."}[ConfirmationStatus(row.status)]
    if status == 409:
        said = f"This question was answered already or is past its deadline. {said}"
    form = format_html(FORM, get_token(request), row.expires_at.isoformat()) \
        if row.status == ConfirmationStatus.PENDING and status == 200 else ""
    return HttpResponse(format_html(PAGE, row.tool, row.summary, said, form), status=status)
