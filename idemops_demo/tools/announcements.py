"""`publish_announcement` (write, needs approval) and `list_announcements` (read)."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from idemops.tools import (
    ApprovalPolicy,
    ConfirmationPolicy,
    Tenant,
    ToolContext,
    ToolInput,
    WriteInput,
    read_tool,
    write_tool,
)
from idemops_demo.models import Announcement

# Publishing to everyone (customers included) takes two people; to staff, one.
APPROVERS_BY_AUDIENCE = {Announcement.Audience.STAFF: 1, Announcement.Audience.EVERYONE: 2}


class PublishAnnouncementInput(WriteInput):
    title: str = Field(min_length=1, max_length=200)
    body: str = Field(min_length=1, max_length=20_000)
    audience: Announcement.Audience = Announcement.Audience.STAFF


class AnnouncementOutput(BaseModel):
    announcement_id: int
    title: str
    body: str
    audience: str
    published_at: datetime


class ListAnnouncementsInput(ToolInput):
    limit: int = Field(20, ge=1, le=100)


class AnnouncementList(BaseModel):
    announcements: list[AnnouncementOutput]


def announcement_output(announcement: Announcement) -> AnnouncementOutput:
    return AnnouncementOutput(announcement_id=announcement.pk, title=announcement.title, body=announcement.body,
                              audience=announcement.audience, published_at=announcement.published_at)


def publishing_needs_approval(tenant: Tenant, args: PublishAnnouncementInput) -> ApprovalPolicy:
    return ApprovalPolicy(
        summary=f"Publish to {args.audience}: “{args.title}” ({len(args.body)} characters)",
        approvals_required=APPROVERS_BY_AUDIENCE[args.audience])


def publishing_is_confirmed(tenant: Tenant, args: PublishAnnouncementInput) -> ConfirmationPolicy:
    return ConfirmationPolicy(summary=f"Publish to {args.audience}: “{args.title}” ({len(args.body)} characters)")


@write_tool(name="publish_announcement", title="Publish an announcement", approval=publishing_needs_approval,
            requires_operation_id=True,
            confirmation=publishing_is_confirmed,
            personal_fields=frozenset({"title", "body"}),
            # Who reads it decides what it is: left out, it is staff, as if sent.
            counted_defaults=({"audience": Announcement.Audience.STAFF},))
def publish_announcement(ctx: ToolContext, args: PublishAnnouncementInput) -> AnnouncementOutput:
    """Publish an announcement to staff (one approver) or everyone (two approvers). Its idempotency_key must be
    an operation_id from prepare_operation. The person behind the agent confirms it first (their host asks
    them); then the call answers
    `pending_approval` with a request_id and publishes nothing; call again with the same idempotency_key
    (or get_approval_status) to learn the outcome."""
    announcement = Announcement.objects.create(tenant_id=ctx.tenant_id, record=ctx.record, title=args.title,
                                               body=args.body, audience=args.audience)
    return announcement_output(announcement)


@read_tool(name="list_announcements", title="List published announcements", personal_fields=frozenset())
def list_announcements(ctx: ToolContext, args: ListAnnouncementsInput) -> AnnouncementList:
    """The tenant's published announcements, newest first."""
    latest = Announcement.objects.filter(tenant_id=ctx.tenant_id)[: args.limit]
    return AnnouncementList(announcements=[announcement_output(a) for a in latest])
