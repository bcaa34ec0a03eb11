"""`get_approval_status` (read): where a sensitive call's approval stands, and its outcome."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from tools_app import approvals
from tools_app.core.errors import NotFound
from tools_app.toolkit.registry import ObjectId, ToolContext, ToolInput, read_tool


class ApprovalStatusInput(ToolInput):
    request_id: ObjectId = Field(description="The request_id from a pending_approval answer.")


class ApprovalStatusOutput(BaseModel):
    request_id: int
    tool: str
    status: str = Field(description="pending, approved (executing), executed, failed, rejected or expired")
    summary: str
    expires_at: str
    approvals_required: int
    approvals_given: int
    reason: str | None = Field(description="Why it was rejected or expired")
    decided_at: str | None
    result: dict[str, Any] | None = Field(description="The operation's result once executed")
    error: dict[str, Any] | None = Field(description="The operation's error once it failed")


@read_tool(name="get_approval_status", title="Get an approval request's status", personal_fields=frozenset())
def get_approval_status(ctx: ToolContext, args: ApprovalStatusInput) -> ApprovalStatusOutput:
    """Where an approval request stands; once executed, the operation's result (the same one a call with the
    original idempotency_key returns)."""
    status = approvals.status_for_agent(ctx.tenant_id, args.request_id)
    if status is None:
        raise NotFound(f"no approval request {args.request_id} in this tenant")
    return ApprovalStatusOutput(**status)
