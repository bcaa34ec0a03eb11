"""Support tickets: `create_ticket` (write) and `get_ticket` (read)."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from idemops.tools import NotFound, ObjectId, ToolContext, ToolInput, WriteInput, read_tool, write_tool
from idemops_demo.models import Ticket


class CreateTicketInput(WriteInput):
    subject: str = Field(min_length=1, max_length=200)
    body: str = Field(min_length=1, max_length=20_000)
    priority: Ticket.Priority = Ticket.Priority.NORMAL


class TicketOutput(BaseModel):
    ticket_id: int
    subject: str
    priority: str
    status: str
    created_at: datetime


class GetTicketInput(ToolInput):
    ticket_id: ObjectId


def ticket_output(ticket: Ticket) -> TicketOutput:
    return TicketOutput(ticket_id=ticket.pk, subject=ticket.subject, priority=ticket.priority,
                        status=ticket.status, created_at=ticket.created_at)


@write_tool(name="create_ticket", title="Open a support ticket", personal_fields=frozenset({"subject", "body"}),
            # Left out, the priority is normal: sending "normal" is the same ticket.
            counted_defaults=({"priority": Ticket.Priority.NORMAL},),
            search_fields=frozenset({"ticket_id", "priority"}))
def create_ticket(ctx: ToolContext, args: CreateTicketInput) -> TicketOutput:
    """Open a support ticket and return its id. Requires idempotency_key: a retry with the same key
    returns the same ticket."""
    ticket = Ticket.objects.create(tenant_id=ctx.tenant_id, record=ctx.record, subject=args.subject,
                                   body=args.body, priority=args.priority)
    return ticket_output(ticket)


@read_tool(name="get_ticket", title="Get a ticket",
           personal_fields=frozenset())
def get_ticket(ctx: ToolContext, args: GetTicketInput) -> TicketOutput:
    """Read one of this tenant's tickets by id."""
    ticket = Ticket.objects.filter(tenant_id=ctx.tenant_id, pk=args.ticket_id).first()
    if ticket is None:
        raise NotFound(f"no ticket {args.ticket_id} in this tenant")
    return ticket_output(ticket)
