"""Approval links: the one-click link in an approver's message, bound to one request and one person,
signed, expiring with the request, and good for one decision.

- Issued (`issue`) for each approver a message is written for, in the transaction that writes the
  message (notices.py): a token signed with Django's signing (SECRET_KEY, its own salt) naming the
  request, the person, the deadline and a random nonce. The row (ApprovalLink) keeps the token's
  SHA-256 digest, never the token.
- Opened (`check`) by the console's decision page (tools_app/admin/approval_links.py) only for a
  session logged in with its second factor; refused, with a message and an audit event
  (`approval_link.refused`), when the signature does not hold (altered, or not ours), when no row
  has its digest, when the person logged in is not the one it was sent to (a forwarded link),
  when it was used, or when it expired.
- Used (`decide`) by one guarded UPDATE (unused, not expired -> used) in the transaction of the
  decision itself, which is the approvals' one decision code (decisions.approve / reject: the
  permission, four eyes, step-up). A refused decision rolls the use back with it, so a link whose
  step-up asked for a fresh code works again after it; a decision taken is never taken twice.

Messages to a channel or an address that is no approver's (an escalation address, a webhook, a
Slack channel) carry the console's link to the request instead (`notices.link`): nobody's in particular.
"""

from __future__ import annotations

import hashlib
import secrets
from typing import TYPE_CHECKING, NoReturn

from django.core import signing
from django.db import transaction
from django.urls import reverse

from tools_app import access
from tools_app.approvals import decisions
from tools_app.approvals.models import ApprovalLink, ApprovalRequest, ApprovalVerdict
from tools_app.conf import conf
from tools_app.core import audit, clock, db
from tools_app.core.errors import Refused

if TYPE_CHECKING:
    from django.contrib.auth.models import User

SALT = "idemops.approval-link"
URL_NAME = "admin:approval_decide"
NONCE_BYTES = 16

USE = access.Permit(decisions.DECIDE_PERMISSION, "use_approval_link", "decide through an approval link",
                    "approval_link.refused")

NOT_VALID = ("This link is not valid: it was altered, or it is not a link idemops sent. Nothing was changed. "
             "Open the request from the console's approval queue instead.")
FORWARDED = ("This link was sent to another person and opens only for them. Nothing was changed. If you may decide "
             "on this request, open it from the console's approval queue.")
EXPIRED = "This link has expired (with its request). Nothing was changed."
USED = "This link was used already: a link decides once. Nothing was changed."


class LinkRefused(Refused):
    """The link cannot be used: `reason` is what the person is shown."""


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def issue(request: ApprovalRequest, user: User) -> str:
    """A new link for `user` to decide on `request` (call in the transaction that writes its message): its URL."""
    token = signing.dumps({"r": request.pk, "u": user.pk, "e": int(request.expires_at.timestamp()),
                           "n": secrets.token_urlsafe(NONCE_BYTES)}, salt=SALT)
    ApprovalLink.objects.create(request=request, user=user, digest=digest(token), created_at=clock.read(),
                                expires_at=request.expires_at)
    return conf().public_url.rstrip("/") + reverse(URL_NAME, args=[token])


def check(token: str, user: User) -> ApprovalLink:
    """The unused, unexpired link `token` stands for, sent to `user`; else LinkRefused (audited)."""
    try:
        signed = signing.loads(token, salt=SALT)
    except signing.BadSignature:
        _refuse(None, user, NOT_VALID, "the signature does not hold")
    row = ApprovalLink.objects.select_related("request", "request__record").filter(digest=digest(token)).first()
    if row is None or not isinstance(signed, dict) or (signed.get("r"), signed.get("u")) != (row.request_id,
                                                                                             row.user_id):
        _refuse(None, user, NOT_VALID, "no such link")
    if row.user_id != user.pk:
        _refuse(row, user, FORWARDED, f"the link was sent to user id {row.user_id}")
    if row.used_at is not None:
        _refuse(row, user, USED, f"used at {row.used_at:%Y-%m-%d %H:%M:%S} to {row.used_for}")
    if row.expires_at <= clock.read():
        _refuse(row, user, EXPIRED, "expired")
    return row


def decide(token: str, user: User, verdict: str, reason: str = "") -> ApprovalRequest:
    """Use the link once for `verdict` (approve / reject) through the approvals' decision code."""
    row = check(token, user)
    permit = decisions.APPROVE if verdict == ApprovalVerdict.APPROVE else decisions.REJECT
    actor = audit.user_actor(user)
    try:
        with transaction.atomic():
            if not db.transition(row, {"used_at": None, "expires_at__gt": clock.NOW},
                                 {"used_at": clock.NOW, "used_for": permit.attempted},
                                 action="approval_link.used", actor=actor, trace_id=row.request.trace_id,
                                 after={"request": row.request_id, "verdict": permit.attempted}):
                raise LinkRefused(USED, row.request)
            if permit is decisions.APPROVE:
                return decisions.approve(row.request, user, reason=reason)
            return decisions.reject(row.request, user, reason=reason)
    except Refused as refused:  # its audit event rolled back with the decision's transaction: written again
        access.audit_refusal(USE if isinstance(refused, LinkRefused) else permit, row.request, actor, refused.reason)
        raise


def _refuse(row: ApprovalLink | None, user: User, message: str, detail: str) -> NoReturn:
    access.audit_refusal(USE, row.request if row is not None else ApprovalLink, audit.user_actor(user),
                         f"{message.split(':')[0].split('.')[0]} ({detail})")
    raise LinkRefused(message, row.request if row is not None else None)
