"""`send_notification` (write, via the outbox) and `get_notification` (read)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from pydantic import BaseModel, Field

from idemops.conf import conf
from idemops.tools import (
    InvalidInput,
    Message,
    NotFound,
    ToolContext,
    ToolInput,
    WriteInput,
    check_url,
    enqueue_message,
    find_message,
    read_tool,
    write_tool,
)


class SendNotificationInput(WriteInput):
    channel: Literal["email", "webhook"]
    recipient: str = Field(min_length=3, max_length=500, description="An email address, or a webhook URL on the "
                                                                     "allow-list")
    subject: str = Field(min_length=1, max_length=200)
    body: str = Field(min_length=1, max_length=50_000)
    sent_at: datetime | None = Field(None, description="When your side sent the request (ISO 8601), for your own "
                                                       "records. Not part of the notification: the same key with "
                                                       "another sent_at is the same notification.")


class NotificationOutput(BaseModel):
    notification_id: str = Field(description="The event id; the receiver sees it as Message-ID / X-Event-Id")
    channel: str
    status: str = Field(description="pending, delivered or dead")
    attempts: int


class GetNotificationInput(ToolInput):
    notification_id: str


def check_recipient(args: SendNotificationInput) -> None:
    """Before the key is claimed: an email address, or a webhook URL on the allow-list (checked again
    by the relay right before it posts)."""
    if args.channel == "email":
        try:
            validate_email(args.recipient)
        except ValidationError:
            raise InvalidInput("recipient: must be an email address for channel email") from None
    else:
        check_url(args.recipient, conf().webhook_allowed_prefixes, field="recipient")


def notification_output(event: Message) -> NotificationOutput:
    return NotificationOutput(notification_id=str(event.id), channel=event.kind.removeprefix("notification."),
                              status=event.status, attempts=event.attempts)


@write_tool(name="send_notification", title="Send a notification",  open_world=True, check=check_recipient,
            non_business_fields=frozenset({"sent_at"}), personal_fields=frozenset({"recipient", "subject", "body"}))
def send_notification(ctx: ToolContext, args: SendNotificationInput) -> NotificationOutput:
    """Queue an email or webhook notification; it is delivered shortly, at least once; exactly once for
    receivers that deduplicate by event id (notification_id: the email's Message-ID, the webhook's
    webhook-id). Requires idempotency_key: a retry with the same key queues nothing new."""
    event = enqueue_message(tenant_id=ctx.tenant_id, record=ctx.record, kind=f"notification.{args.channel}",
                           payload={"recipient": args.recipient, "subject": args.subject, "body": args.body})
    return notification_output(event)


@read_tool(name="get_notification", title="Get a notification's delivery status", personal_fields=frozenset())
def get_notification(ctx: ToolContext, args: GetNotificationInput) -> NotificationOutput:
    """Read whether one of this tenant's notifications was delivered."""
    event = find_message(ctx.tenant_id, args.notification_id)
    if event is None:
        raise NotFound(f"no notification {args.notification_id} in this tenant")
    return notification_output(event)

