"""`whoami`: which tenant and agent identity a token stands for (no database work)."""

from pydantic import BaseModel

from tools_app.toolkit.registry import ToolContext, ToolInput, read_tool


class WhoamiOutput(BaseModel):
    tenant_id: int
    agent: str


@read_tool(name="whoami", title="Who am I",
           personal_fields=frozenset())
def whoami(ctx: ToolContext, args: ToolInput) -> WhoamiOutput:
    """Return the tenant and agent identity of the calling token: a cheap way to check credentials."""
    return WhoamiOutput(tenant_id=ctx.tenant_id, agent=ctx.actor)
