"""Tenants' notification channels: approvers told where they work (Slack, Microsoft Teams, PagerDuty,
Discord, Matrix, a JSON endpoint, ...), beside email, through Apprise URLs.

Why Apprise: one library speaks about a hundred services, each configured by one URL
(`slack://…`, `msteams://…`, `pagerduty://…`, `json://host/path`), so a tenant adds a channel with
a URL, not with code here; see https://github.com/caronc/apprise/wiki.

- A channel's URL carries its secret (a webhook token, an integration key), so it is stored sealed
  like the webhook signing secrets (core.redaction.seal under IDEMOPS_SECRET_KEY); the console shows
  its scheme and host only, and never the URL once saved. Changing it is an operator operation behind
  its Permit, audited without the URL.
- A message to a channel is an outbox event (`notification.channel`) naming the channel by id, not
  its URL: the relay opens the URLs of a batch before its delivery threads start, delivers through
  Apprise (delivery.py), and a channel that fails is retried with the outbox's backoff, then
  dead-lettered, like any event: visible in the console's outbox pages and on the channel's row.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from django.db import transaction

from tools_app import access
from tools_app.core import audit, redaction
from tools_app.core.errors import InvalidInput
from tools_app.outbox.models import NotificationChannel

if TYPE_CHECKING:
    from django.contrib.auth.models import AnonymousUser, User

CHANNEL_KIND = "notification.channel"

CHANGE_CHANNEL = access.Permit("tools_app.manage_notificationchannel", "change_channel",
                               "configure notification channels", "notification_channel.change_refused")


def shown(url: str) -> str:
    """What the console shows of a channel's URL: its scheme and host, nothing that may be a secret."""
    parts = urlsplit(url)
    host = (parts.hostname or "").split("@")[-1]
    return f"{parts.scheme}://{host}/…" if host else f"{parts.scheme}://…"


def check_url(url: str) -> str:
    """`url` if Apprise knows its service, else InvalidInput (without the URL: it may hold a secret)."""
    import apprise

    url = url.strip()
    if not url or apprise.Apprise.instantiate(url) is None:
        raise InvalidInput(f"not an Apprise URL of a service Apprise knows ({shown(url)}); see "
                           "https://github.com/caronc/apprise/wiki")
    return url


def save_channel(row: NotificationChannel, user: User | AnonymousUser, *, url: str | None) -> NotificationChannel:
    """Save `row` for `user` (who needs CHANGE_CHANNEL on its tenant), with a new `url` if given: sealed."""
    actor = access.authorize(user, CHANGE_CHANNEL, row)
    if url is not None:
        url = check_url(url)
        row.sealed_url, row.shown = redaction.seal({"url": url}), shown(url)
    if not row.sealed_url:
        raise InvalidInput("a channel needs its Apprise URL")
    with transaction.atomic():
        row.save()
        audit.record_event(action="notification_channel.changed", obj=row, actor=actor, after={
            "name": row.name, "shown": row.shown, "enabled": row.enabled, "escalations_only": row.escalations_only,
            "url_changed": url is not None})
    return row


def channels_of(tenant_id: int, *, escalation: bool) -> list[NotificationChannel]:
    """The tenant's enabled channels told of a new request (or, with `escalation`, of an escalation)."""
    channels = NotificationChannel.objects.filter(tenant_id=tenant_id, enabled=True).order_by("name")
    return list(channels if escalation else channels.filter(escalations_only=False))


def urls_of(channel_ids: Collection[int]) -> dict[int, str]:
    """Channel id -> its opened URL; a channel deleted, or sealed under a key that is gone, is missing."""
    result: dict[int, str] = {}
    for pk, sealed in NotificationChannel.objects.filter(pk__in=set(channel_ids)).values_list("pk", "sealed_url"):
        try:
            result[pk] = redaction.unseal(sealed).get("url", "")
        except InvalidInput:
            continue
    return result
