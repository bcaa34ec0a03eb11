"""The person behind the agent confirms a call through their MCP host, before it runs.

A tool declares `confirmation` (toolkit.registry.ToolSpec): a rule of the tenant and the arguments
returning a ConfirmationPolicy (its summary) or None. A call through /mcp of such a tool, with no
record for its key yet, is not claimed: a Confirmation row (pending, with a random token, bound to
the tenant, the agent identity, the tool, the key, the arguments' fingerprint and a deadline) is
written and the call answers `confirmation_required`. The MCP layer (tools_app.mcp.confirming) asks
the person through the host (an input-required form at 2026-07-28, `elicitation/create` at
2025-11-25) and calls again with their answer, or hands the class and the confirmation page's link
to a host that cannot ask.

An answer is accepted once: one conditional UPDATE of the row, pending -> confirmed or declined,
holding only for the same tenant, agent, tool, key and fingerprint before the deadline; any other
answer is `confirmation_refused` and nothing runs. Confirmed, the call runs (once: the engine); declined,
the key's record is FAILED with `confirmation_declined`, final, and its replay says so. Every decision
is in the audit log: who, what, through which host.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any, NoReturn

from django.db import models, transaction
from django.db.models import Q
from django.db.models.functions import Now
from pydantic import BaseModel

from tools_app import engine
from tools_app.access.models import Tenant
from tools_app.conf import conf
from tools_app.core import audit, clock
from tools_app.core.errors import ConfirmationDeclined, ConfirmationRefused, ConfirmationRequired
from tools_app.engine.claims import find_live
from tools_app.engine.models import IdempotencyRecord
from tools_app.toolkit import registry


class ConfirmationStatus(models.TextChoices):
    PENDING = "pending", "Asked, not answered"
    CONFIRMED = "confirmed", "Confirmed on the confirmation page; runs at the next call with its key"
    ACCEPTED = "accepted", "Confirmed, and its call ran"
    DECLINED = "declined", "Declined"


class Confirmation(models.Model):
    """One question to the person behind an agent: may this call run? Answered once."""

    token = models.UUIDField(unique=True, default=uuid.uuid4, editable=False,
                             help_text="Carried in the sealed request state and the confirmation page's address.")
    tenant = models.ForeignKey("tools_app.Tenant", on_delete=models.CASCADE, related_name="+")
    actor = models.CharField(max_length=200, help_text="The agent identity that called (the principal).")
    tool = models.CharField(max_length=100)
    key = models.CharField(max_length=255, help_text="The idempotency key of the call.")
    fingerprint = models.CharField(max_length=64, help_text="The fingerprint of the call's business arguments.")
    summary = models.TextField(help_text="What the person is asked to confirm (only what they sent).")
    status = models.CharField(max_length=16, choices=ConfirmationStatus.choices, default=ConfirmationStatus.PENDING)
    host = models.CharField(max_length=200, blank=True, help_text="The MCP host that asked (clientInfo), or "
                                                                  "'confirmation page'.")
    decided_by = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    decided_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["tenant", "tool", "key"], name="confirmation_key")]


@dataclass(frozen=True)
class Answer:
    """What the person answered, through the host, to the question `token` names."""

    token: str
    confirmed: bool


@dataclass(frozen=True)
class Confirming:
    """A call through an MCP host that can be asked: the host's name, and the answer if it brings one."""

    host: str
    answer: Answer | None = None


def confirm(spec: registry.ToolSpec, tenant_id: int, actor: str, args: BaseModel, operation: engine.Operation,
            execute: engine.Executor, confirming: Confirming) -> tuple[engine.Operation, engine.Executor]:
    """The operation to run for a call of a tool with a confirmation rule (the toolkit's hook): the
    call itself once confirmed (or when its key has a record already: that record answers); its
    declined form (FAILED, confirmation_declined) once declined. Raises ConfirmationRequired while
    unanswered, ConfirmationRefused for an answer that does not hold."""
    assert spec.confirmation is not None
    if confirming.answer is not None:
        confirmed = answer(tenant_id, actor, operation, confirming.answer, host=confirming.host)
        return (operation, execute) if confirmed else declined(operation)
    live = find_live(operation)
    if live is not None and not engine.is_expired(live):
        return operation, execute  # a replay, a follower, a conflict: the engine answers
    decided = decided_on_page(tenant_id, actor, operation)
    if decided is not None:
        return (operation, execute) if decided else declined(operation)
    policy = spec.confirmation(Tenant.objects.get(pk=tenant_id), args)
    if policy is None:
        return operation, execute
    ask(tenant_id, actor, operation, policy.summary, policy.ttl.total_seconds(), host=confirming.host)


def ask(tenant_id: int, actor: str, operation: engine.Operation, summary: str, seconds: float, *,
        host: str) -> NoReturn:
    now = clock.read()
    row = Confirmation.objects.create(
        tenant_id=tenant_id, actor=actor, tool=operation.tool, key=operation.key, fingerprint=operation.fingerprint,
        summary=summary, host=host[:200], created_at=now, expires_at=now + timedelta(seconds=seconds))
    raise ConfirmationRequired(
        f"the person behind the agent must confirm this call first: {summary}. Nothing was done. Their MCP "
        f"host asks them; a host that cannot, shows them details.confirmation.url; then call again with the "
        f"same idempotency_key, before {row.expires_at.isoformat()}",
        details={"confirmation": {"id": str(row.token), "summary": summary,
                                  "expires_at": row.expires_at.isoformat(), "url": page_url(row)}})


def page_url(row: Confirmation) -> str:
    return f"{conf().public_url.rstrip('/')}/confirmations/{row.token}/"


def _holding(tenant_id: int, actor: str, operation: engine.Operation) -> Q:
    """The rows an answer for this call may decide: its own, still before their deadline."""
    return Q(tenant_id=tenant_id, actor=actor, tool=operation.tool, key=operation.key,
             fingerprint=operation.fingerprint, expires_at__gt=Now())


def answer(tenant_id: int, actor: str, operation: engine.Operation, given: Answer, *, host: str) -> bool:
    """Accept the person's answer once: True confirmed, False declined; ConfirmationRefused when it
    is not this call's, past its deadline or answered already."""
    try:
        token = uuid.UUID(given.token)
    except ValueError:
        _refused(tenant_id, actor, operation, host, "malformed")
    status = ConfirmationStatus.ACCEPTED if given.confirmed else ConfirmationStatus.DECLINED
    with transaction.atomic():
        taken = Confirmation.objects.filter(_holding(tenant_id, actor, operation), token=token,
                                            status=ConfirmationStatus.PENDING).update(
            status=status, host=host[:200], decided_by=actor, decided_at=Now())
        if taken == 1:
            _audit(Confirmation.objects.get(token=token),
                   f"confirmation.{'confirmed' if given.confirmed else 'declined'}", actor)
            return given.confirmed
    _refused(tenant_id, actor, operation, host, "no pending confirmation of this call")


def _refused(tenant_id: int, actor: str, operation: engine.Operation, host: str, why: str) -> NoReturn:
    # Kept: who tried to confirm what, through which host (nothing else changed).
    audit.record_event(action="confirmation.refused", obj=Confirmation, actor=actor, tenant_id=tenant_id,
                       after={"tool": operation.tool, "host": host[:200], "why": why})
    raise ConfirmationRefused("this confirmation does not hold for this call (other arguments, another principal, "
                              "past its deadline, or answered already); nothing was done")


def decided_on_page(tenant_id: int, actor: str, operation: engine.Operation) -> bool | None:
    """A decision its person made on the confirmation page for this very call, taken now (once)."""
    for row in Confirmation.objects.filter(_holding(tenant_id, actor, operation), status__in=[
            ConfirmationStatus.CONFIRMED, ConfirmationStatus.DECLINED], host=PAGE).order_by("-pk")[:1]:
        if row.status == ConfirmationStatus.DECLINED:
            return False
        if Confirmation.objects.filter(pk=row.pk, status=ConfirmationStatus.CONFIRMED).update(
                status=ConfirmationStatus.ACCEPTED):
            return True
    return None


PAGE = "confirmation page"


def decide_on_page(row: Confirmation, *, confirmed: bool, person: str) -> bool:
    """The person's decision on the confirmation page (behind their login); False if it was answered already
    or is past its deadline."""
    status = ConfirmationStatus.CONFIRMED if confirmed else ConfirmationStatus.DECLINED
    with transaction.atomic():
        taken = Confirmation.objects.filter(pk=row.pk, status=ConfirmationStatus.PENDING, expires_at__gt=Now()).update(
            status=status, host=PAGE, decided_by=person, decided_at=Now())
        if taken:
            row.refresh_from_db()
            _audit(row, f"confirmation.{'confirmed' if confirmed else 'declined'}", person)
    return bool(taken)


def _audit(row: Confirmation, action: str, actor: str) -> None:
    audit.record_event(action=action, obj=row, actor=actor, tenant_id=row.tenant_id,
                       after={"tool": row.tool, "summary": row.summary, "host": row.host, "status": row.status,
                              "requested_by": row.actor})


def declined(operation: engine.Operation) -> tuple[engine.Operation, engine.Executor]:
    """The declined call as the engine runs it: its record ends FAILED, confirmation_declined (final),
    with nothing executed (no approval asked, no downstream admitted)."""

    def refuse(record: IdempotencyRecord) -> dict[str, Any]:
        raise ConfirmationDeclined("the person behind the agent declined this operation; nothing was done, and "
                                   "this key is closed (a new operation needs a new key)")

    return replace(operation, approval=None, admit=None), refuse
