"""Telling approvers: a message when a request needs them, and a second one (escalation) when it is
still waiting after the tenant's escalation time.

Messages go through the outbox, written in the transaction that creates (or escalates) the
request: no request without its messages, no message about a request that rolled back, and the
relay delivers each at least once (the receiver deduplicates by event id). Who is told:

- by email, the tenant's approvers: active users granted the tenant (`grant_role … --tenant`) who
  may decide approvals and have an email address, except the owner of the agent that asked (four
  eyes: they cannot approve it);
- by webhook, the tenant's `ApprovalSettings.notify_webhook_url`, if set (checked against the
  webhook allow-list by the relay before each attempt);
- on escalation, also the tenant's `escalation_email`, if set;
- through each of the tenant's enabled channels (outbox.channels: Apprise URLs for Slack, Microsoft
  Teams, PagerDuty, ...; a channel marked `escalations_only` only on escalation).

Messages carry the operation's summary without the values of the tool's declared personal arguments
(`public_summary`: "Pay 42.00 EUR to [personal]") and a link (under IDEMOPS_PUBLIC_URL): an approver's email
its own one-click link to the decision (links.py: signed, for that person only, used once); every
other message the request's page in the operators' console. An approver reads the rest there; never the
call's arguments. Delivered messages do not outlive the call's retention either (retention.purge).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.db import transaction
from django.db.models import DateTimeField, ExpressionWrapper, OuterRef, Q, QuerySet, Subquery, Value
from django.db.models.functions import Coalesce
from django.urls import reverse

from tools_app import outbox
from tools_app.approvals import links
from tools_app.approvals.execution import APPROVAL_SWEEPER
from tools_app.approvals.models import ApprovalRequest, ApprovalSettings, ApprovalStatus
from tools_app.conf import conf
from tools_app.core import clock, db, redaction
from tools_app.toolkit import registry

if TYPE_CHECKING:
    from django.contrib.auth.models import User

REQUESTED, ESCALATED = "approval.requested", "approval.escalated"
# The console's page for one request, whatever its state (the admin site routes it).
LINK_URL_NAME = "admin:approval_link"
ESCALATION_BATCH = 200


def link(request: ApprovalRequest) -> str:
    return conf().public_url.rstrip("/") + reverse(LINK_URL_NAME, args=[request.pk])


def public_summary(request: ApprovalRequest) -> str:
    """The request's summary without the values of its tool's personal arguments (a tool this code no
    longer declares: without any argument any tool declares personal)."""
    spec = next((spec for spec in registry.all_tools() if spec.name == request.tool), None)
    personal = spec.personal_fields or () if spec is not None else redaction.personal_fields()
    return redaction.without_personal(request.summary, request.arguments, personal)


def approvers_of(request: ApprovalRequest) -> list[User]:
    """Who may approve `request` and can be emailed: see the module docstring."""
    decide = Permission.objects.filter(content_type__app_label="tools_app", codename="decide_approvalrequest")
    may_decide = Q(is_superuser=True) | Q(user_permissions__in=decide) | Q(groups__permissions__in=decide)
    people = (get_user_model().objects.filter(may_decide, is_active=True, tenant_access__tenant_id=request.tenant_id)
              .exclude(email="").distinct().order_by("username"))
    if request.requester_owner_id is not None:
        people = people.exclude(pk=request.requester_owner_id)
    return list(people)


def announce(request: ApprovalRequest) -> int:
    """Queue the messages about a new request (call in its transaction). Returns how many."""
    return _send(request, REQUESTED, extra_emails=[])


def _send(request: ApprovalRequest, event: str, *, extra_emails: list[str], now: datetime | None = None) -> int:
    config = ApprovalSettings.of(request.tenant)
    sent = 0
    # Each approver's message carries a link of their own (links.py: signed, theirs only, good once).
    approvers = {user.email: user for user in approvers_of(request)}
    for email in dict.fromkeys([*approvers, *extra_emails]):  # one message per address, in order
        person = approvers.get(email)
        subject, body = _message(request, event, now, links.issue(request, person) if person else link(request))
        outbox.enqueue(tenant_id=request.tenant_id, kind="notification.email", record=request.record,
                       payload={"recipient": email, "subject": subject, "body": body})
        sent += 1
    subject, body = _message(request, event, now, link(request))
    if config.notify_webhook_url:
        outbox.enqueue(tenant_id=request.tenant_id, kind="notification.webhook", record=request.record,
                       payload={"recipient": config.notify_webhook_url, "subject": subject, "body": body,
                                "data": _data(request, event)})
        sent += 1
    # The tenant's channels (Slack, Teams, PagerDuty, ...: outbox.channels), by their id: the URL stays sealed.
    for channel in outbox.channels_of(request.tenant_id, escalation=event == ESCALATED):
        outbox.enqueue(tenant_id=request.tenant_id, kind=outbox.CHANNEL_KIND, record=request.record,
                       payload={"channel": channel.pk, "subject": subject, "body": body})
        sent += 1
    return sent


def _message(request: ApprovalRequest, event: str, now: datetime | None, url: str) -> tuple[str, str]:
    tenant, summary = request.tenant.slug, public_summary(request)
    if event == ESCALATED:
        waited = _duration((now or clock.read()) - request.created_at)
        subject = f"[idemops] ESCALATED: still waiting after {waited}: {summary}"
        opening = (f"A request of tenant {tenant} has waited {waited} for approval and is escalated. "
                   "It needs a decision before it expires.")
    else:
        subject = f"[idemops] Approval needed: {summary}"
        opening = f"An agent of tenant {tenant} asks to run {request.tool}. Nothing has been done yet."
    lines = [opening, "", f"  {summary}"]
    if request.amount is not None:
        lines.append(f"  Amount:    {request.amount:.2f} {request.currency}")
    lines += [f"  Asked by:  {request.requested_by}",
              f"  Approvals: {request.approvals} of {request.required_approvals} given",
              f"  Expires:   {request.expires_at:%Y-%m-%d %H:%M} UTC", "",
              "Open it to approve or reject:", f"  {url}", "",
              f"You get this because you may approve requests of tenant {tenant}."]
    return subject[:200], "\n".join(lines)


def _data(request: ApprovalRequest, event: str) -> dict[str, Any]:
    return {"event": event, "request_id": request.pk, "tenant": request.tenant.slug, "tool": request.tool,
            "summary": public_summary(request), "amount": None if request.amount is None else f"{request.amount:.2f}",
            "currency": request.currency or None, "requested_by": request.requested_by,
            "approvals_required": request.required_approvals, "approvals_given": request.approvals,
            "created_at": request.created_at.isoformat(), "expires_at": request.expires_at.isoformat(),
            "escalated": event == ESCALATED, "url": link(request)}


def _duration(delta: timedelta) -> str:
    minutes = int(delta.total_seconds() // 60)
    return f"{minutes} min" if minutes < 120 else f"{minutes // 60} h {minutes % 60} min"


# --- escalation ----------------------------------------------------------------------------------


def due_for_escalation(now: datetime | None = None) -> QuerySet[ApprovalRequest]:
    """PENDING requests older than their tenant's `escalate_after_minutes` (0: never), not yet escalated,
    at `now` (default: the database's time, compared in SQL: a host whose clock runs ahead would escalate early)."""
    default = ApprovalSettings._meta.get_field("escalate_after_minutes").default
    # A subquery, not a join: a tenant without settings (the default) must stay in the result.
    configured = ApprovalSettings.objects.filter(tenant_id=OuterRef("tenant_id")).values("escalate_after_minutes")
    after = Coalesce(Subquery(configured[:1]), Value(default))
    at = clock.NOW if now is None else Value(now, output_field=DateTimeField())
    since = ExpressionWrapper(at - after * Value(timedelta(minutes=1)), output_field=DateTimeField())
    return (ApprovalRequest.objects.filter(status=ApprovalStatus.PENDING, escalated_at__isnull=True,
                                           expires_at__gt=at)
            .annotate(escalate_after=after).exclude(escalate_after=0).filter(created_at__lte=since))


@transaction.atomic
def escalate(request: ApprovalRequest) -> bool:
    """PENDING, not escalated -> escalated (escalated_at), with its audit event and its messages."""
    now = clock.read()  # the database's: what escalated_at and the wait are measured by everywhere
    waited = int((now - request.created_at).total_seconds() // 60)
    if not db.transition(request, {"status": ApprovalStatus.PENDING, "escalated_at": None},
                         {"escalated_at": now}, action=ESCALATED, actor=APPROVAL_SWEEPER,
                         reason=f"still waiting after {waited} min", after={"waited_minutes": waited}):
        return False
    extra = [ApprovalSettings.of(request.tenant).escalation_email]
    _send(request, ESCALATED, extra_emails=[email for email in extra if email], now=now)
    return True


def escalate_due(now: datetime | None = None) -> int:
    """Escalate every request that is due (the periodic job)."""
    due = due_for_escalation(now).select_related("tenant", "record").order_by("created_at")
    return sum(escalate(request) for request in due[:ESCALATION_BATCH])
