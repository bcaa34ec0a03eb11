"""`process_ticket_batch`: one action (assign, set priority, close with a note) applied to up to
10,000 tickets, as a long task.

The tickets are processed in chunks (`IDEMOPS_TICKET_BATCH_CHUNK`), each chunk
one transaction that also records its per-ticket outcomes (StepContext.each_batch):
a worker killed mid-run loses at most the chunk it was in, and the task resumes
at that chunk, so each ticket is changed once. Within a chunk each ticket has a
savepoint of its own: a ticket that cannot take the action fails alone.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Annotated, Any, Literal

from django.db import DatabaseError, transaction
from django.utils import timezone
from pydantic import BaseModel, Field, field_validator

from idemops.tools import (
    InvalidInput,
    KeepFor,
    ObjectId,
    Pipeline,
    Retention,
    Step,
    StepContext,
    StrictModel,
    ToolFailure,
    WriteInput,
    invalid_data,
    long_tool,
)
from idemops_demo.idemops_settings import DemoSettings
from idemops_demo.models import Ticket, TicketNote

MAX_TICKETS = 10_000


class AssignAction(StrictModel):
    type: Literal["assign"]
    assignee: str = Field(min_length=1, max_length=200, description="Who the tickets are assigned to.")


class SetPriorityAction(StrictModel):
    type: Literal["set_priority"]
    priority: Ticket.Priority


class CloseAction(StrictModel):
    type: Literal["close"]
    note: str = Field(min_length=1, max_length=5000, description="Why: added to each ticket it closes.")


Action = Annotated[AssignAction | SetPriorityAction | CloseAction, Field(discriminator="type")]


class ProcessTicketBatchInput(WriteInput):
    ticket_ids: list[ObjectId] = Field(min_length=1, max_length=MAX_TICKETS,
                                       description=f"The tickets, each once (at most {MAX_TICKETS}).")
    # Named `change`, not `action`: personal argument names are redacted in every log line, and
    # `action` is the field an operator's log line names its action by.
    change: Action = Field(description="What to do to each ticket: assign, set_priority, or close with a note.")

    @field_validator("ticket_ids")
    @classmethod
    def each_once(cls, ticket_ids: list[int]) -> list[int]:
        seen: set[int] = set()
        for ticket_id in ticket_ids:
            if ticket_id in seen:
                raise ValueError(f"ticket {ticket_id} is listed twice")
            seen.add(ticket_id)
        return ticket_ids


class TicketOutcome(BaseModel):
    ticket_id: int
    outcome: Literal["changed", "unchanged", "not_found", "failed"]
    error_class: str | None = None
    message: str | None = None


class TicketBatchResult(BaseModel):
    action: str
    total: int
    changed: int
    unchanged: int
    not_found: int
    failed: int
    items: list[TicketOutcome] = Field(description="One outcome per ticket, in the order given.")


def _act(ticket: Ticket, action: AssignAction | SetPriorityAction | CloseAction, task_id: uuid.UUID) -> bool:
    """Apply the action to one locked ticket; False if it already had that state."""
    if isinstance(action, CloseAction):
        if ticket.status == "closed":
            return False
        ticket.status, ticket.closed_at = "closed", timezone.now()
        ticket.save(update_fields=["status", "closed_at"])
        TicketNote.objects.create(ticket=ticket, body=action.note, task_id=task_id, created_at=ticket.closed_at)
        return True
    if ticket.status == "closed":
        raise InvalidInput("the ticket is closed")
    field, value = (("assignee", action.assignee) if isinstance(action, AssignAction)
                    else ("priority", action.priority))
    if getattr(ticket, field) == value:
        return False
    setattr(ticket, field, value)
    ticket.save(update_fields=[field])
    return True


def apply_action(ctx: StepContext[ProcessTicketBatchInput]) -> dict[str, Any]:
    args = ctx.arguments

    def apply(chunk: list[int]) -> list[dict[str, Any]]:
        # Locked in id order, like every multi-row lock here, so two batches over the same tickets
        # never deadlock.
        tickets = {ticket.pk: ticket for ticket in Ticket.objects.select_for_update()
                   .filter(tenant_id=ctx.tenant_id, pk__in=chunk).order_by("pk")}
        outcomes = []
        for ticket_id in chunk:
            ticket = tickets.get(ticket_id)
            if ticket is None:
                outcomes.append({"ticket_id": ticket_id, "outcome": "not_found"})
                continue
            try:
                with transaction.atomic():
                    changed = _act(ticket, args.change, ctx.task_id)
            except (ToolFailure, DatabaseError) as exc:
                failure = exc if isinstance(exc, ToolFailure) else invalid_data(exc)
                outcomes.append({"ticket_id": ticket_id, "outcome": "failed", "error_class": str(failure.error_class),
                                 "message": failure.message})
                continue
            outcomes.append({"ticket_id": ticket_id, "outcome": "changed" if changed else "unchanged"})
        return outcomes

    chunk_size = DemoSettings.current().ticket_batch_chunk
    items = [item for chunk in ctx.each_batch(args.ticket_ids, chunk_size, apply) for item in chunk]
    counts = {outcome: sum(1 for item in items if item["outcome"] == outcome)
              for outcome in ("changed", "unchanged", "not_found", "failed")}
    return TicketBatchResult(action=args.change.type, total=len(items), items=items, **counts).model_dump()


TICKET_BATCH = Pipeline(steps=(Step("apply", apply_action),))

long_tool(
    name="process_ticket_batch", title="Process a batch of tickets", input_model=ProcessTicketBatchInput,
    output_model=TicketBatchResult, pipeline=TICKET_BATCH,
    # Up to 10,000 outcomes per chunk record and checkpoint: kept a day, the task's result for the usual time.
    retention=Retention(keep=KeepFor(artifacts=timedelta(days=1))),
    # The change names a person (assignee) or carries free text (a closing note).
    personal_fields=frozenset({"change"}),
    description="Apply one change to up to 10,000 of your tickets: assign them, set their priority, or close them "
                "with a note. Runs as a durable task, in chunks: a crash resumes at the chunk it was in and each "
                "ticket is changed once. The result lists each ticket's outcome (changed, unchanged, not_found, "
                "failed with its error class). Requires idempotency_key; a retry with the same key rejoins the "
                "same task. Clients speaking the MCP tasks extension get a task handle at once.",
)
