"""`delete_record`: delete one of the tenant's orders or tickets, after a person approves."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from idemops.tools import (
    ApprovalPolicy,
    ConfirmationPolicy,
    NotFound,
    ObjectId,
    Tenant,
    ToolContext,
    WriteInput,
    write_tool,
)
from idemops_demo.models import Order, Ticket

DELETABLE: dict[str, type[Order] | type[Ticket]] = {"order": Order, "ticket": Ticket}


class DeleteRecordInput(WriteInput):
    kind: Literal["order", "ticket"]
    id: ObjectId = Field(description="The order_id or ticket_id.")
    reason: str = Field(min_length=1, max_length=500, description="Why it should go; the approver reads it.")


class DeleteRecordOutput(BaseModel):
    kind: str
    id: int
    deleted: bool
    description: str = Field(description="What was deleted.")


def find(tenant_id: int, kind: str, object_id: int) -> Order | Ticket:
    target = DELETABLE[kind].objects.filter(tenant_id=tenant_id, pk=object_id).first()
    if target is None:
        raise NotFound(f"no {kind} {object_id} in this tenant")
    return target


def describe(target: Order | Ticket) -> str:
    if isinstance(target, Order):
        lines = target.lines.count()
        return (f"order #{target.pk} of {target.customer}, {target.total:.2f} {target.currency}, "
                f"{lines} line{'s' if lines != 1 else ''}")
    return f"ticket #{target.pk} “{target.subject}” ({target.priority}, {target.status})"


def deletion_needs_approval(tenant: Tenant, args: DeleteRecordInput) -> ApprovalPolicy:
    # Checked before a person is asked: nobody should approve deleting nothing.
    target = find(tenant.pk, args.kind, args.id)
    return ApprovalPolicy(summary=f"Delete {describe(target)}. Reason: {args.reason}")


def deletion_is_confirmed(tenant: Tenant, args: DeleteRecordInput) -> ConfirmationPolicy:
    # Always; the summary names only what the user sent (never the order's customer).
    return ConfirmationPolicy(summary=f"Delete {args.kind} #{args.id}. Reason: {args.reason}")


@write_tool(name="delete_record", title="Delete an order or a ticket", destructive=True,
            approval=deletion_needs_approval,
            requires_operation_id=True, personal_fields=frozenset({"reason"}), confirmation=deletion_is_confirmed)
def delete_record(ctx: ToolContext, args: DeleteRecordInput) -> DeleteRecordOutput:
    """Delete one of this tenant's orders or tickets. Its idempotency_key must be an operation_id from
    prepare_operation. The person behind the agent confirms it first (their host asks them); then it needs
    a person's approval: the first call answers
    `pending_approval` with a request_id and the summary shown to the approver, and deletes nothing. Call
    again with the same idempotency_key (or get_approval_status) to learn the outcome."""
    target = find(ctx.tenant_id, args.kind, args.id)
    description = describe(target)
    # Delete by query, not by the object read above: if it went meanwhile, say so instead of claiming a deletion.
    if not DELETABLE[args.kind].objects.filter(tenant_id=ctx.tenant_id, pk=args.id).delete()[0]:
        raise NotFound(f"no {args.kind} {args.id} in this tenant (deleted meanwhile)")
    return DeleteRecordOutput(kind=args.kind, id=args.id, deleted=True, description=description)
