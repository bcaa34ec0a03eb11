"""Delivering one outbox event to its consumer: email over SMTP, or a webhook POST to an address
on the allow-list (checked again here: stored data is not trusted). Consumers deduplicate by the
event id (email Message-ID; webhook `webhook-id`, also sent as X-Event-Id and Idempotency-Key).

A webhook is signed the Standard Webhooks way (the `standardwebhooks` library, so a receiver
verifies it with any of that spec's libraries): `webhook-id` (the event id: the same on every
redelivery), `webhook-timestamp` (when this attempt was sent), and `webhook-signature`, one `v1,`
HMAC-SHA256 of `id.timestamp.body` per secret of the tenant (tools_app.access.webhook_secrets:
two while a rotation overlaps). The body sent is exactly the bytes signed. Both also carry the
operation that wrote the event (X-Operation-Id), as the payment gateway's requests do, and the
trace context of the delivery (`traceparent`: an email header, an HTTP header).

Kinds: `notification.email` and `notification.webhook` (send_notification: subject and body),
`task.webhook` (a finished task's notice: the JSON its payload holds, tools_app.tasks), and
`notification.channel` (a tenant's Apprise channel, channels.py: its URL, opened by the relay, is
passed in; Apprise posts subject and body to Slack, Teams, PagerDuty, ...).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import httpx2
from django.conf import settings
from django.core.mail import EmailMessage, get_connection
from standardwebhooks import Webhook

from tools_app.conf import conf
from tools_app.core import tracing, url_allowlist
from tools_app.core.errors import InvalidInput, Transient
from tools_app.outbox.channels import CHANNEL_KIND
from tools_app.outbox.models import OutboxEvent


class DeliveryFailed(Exception):
    """The consumer did not take the event; try again later."""

    final = False


class DeliveryRefused(DeliveryFailed):
    """The event must not be delivered as it is (its webhook URL fails the allow-list): dead at once."""

    final = True


WEBHOOK_KINDS = frozenset({"notification.webhook", "task.webhook"})


def deliver(event: OutboxEvent, signing_secrets: Sequence[str] = (), channel_url: str = "") -> None:
    """Deliver `event`; a webhook is signed with each of `signing_secrets` (its tenant's), a channel's
    message goes to `channel_url` (both read by the relay beforehand: delivery threads do no database work)."""
    if event.kind == CHANNEL_KIND:
        _notify_channel(event, channel_url)
    elif event.kind == "notification.email":
        _send_email(event)
    elif event.kind == "notification.webhook":
        # `data`: what a machine reads (e.g. an approval request's id, state and link), when the writer gave it.
        _post_webhook(event, {"subject": event.payload["subject"], "body": event.payload["body"],
                              **({"data": event.payload["data"]} if "data" in event.payload else {})},
                      signing_secrets)
    elif event.kind == "task.webhook":
        _post_webhook(event, event.payload["json"], signing_secrets)
    else:
        raise DeliveryFailed(f"no delivery for kind {event.kind!r}")


def _notify_channel(event: OutboxEvent, url: str) -> None:
    """One message through Apprise to the channel's URL. Apprise's own log lines may show the URL (a
    secret): the failure recorded says only what went wrong, in Apprise's words minus the URL."""
    import apprise

    if not url:
        raise DeliveryFailed("the channel is gone or its URL cannot be opened (IDEMOPS_SECRET_KEY changed): "
                             "set its URL again in the console")
    notifier = apprise.Apprise(asset=apprise.AppriseAsset(storage_mode=apprise.PersistentStoreMode.MEMORY))
    if not notifier.add(url):
        raise DeliveryRefused("Apprise does not know this channel's URL any more")
    # Apprise's LogCapture has no annotations.
    with apprise.LogCapture(level=apprise.logging.WARNING) as captured:  # type: ignore[no-untyped-call]
        delivered = notifier.notify(title=event.payload["subject"], body=event.payload["body"])
    if not delivered:
        said = [line.strip() for line in captured.getvalue().splitlines() if line.strip()]
        raise DeliveryFailed((f"the channel did not take it: {said[-1] if said else 'no answer'}"
                              ).replace(url, "[channel url]")[:300])


def operation_header(event: OutboxEvent) -> dict[str, str]:
    """The operation that wrote the event, named as everywhere else (not for deduplication: that is the event id)."""
    return {"X-Operation-Id": str(event.operation_id)} if event.operation_id else {}


def _send_email(event: OutboxEvent) -> None:
    payload = event.payload
    message = EmailMessage(subject=payload["subject"], body=payload["body"], to=[payload["recipient"]],
                           headers={"Message-ID": f"<{event.id}@idemops>", **operation_header(event),
                                    **tracing.carrier()},
                           connection=get_connection(timeout=settings.EMAIL_TIMEOUT))
    try:
        message.send()
    except Exception as exc:  # smtplib and socket errors alike: the sink did not accept it
        raise DeliveryFailed(f"{type(exc).__name__}: {exc}"[:300]) from exc


def signature_headers(event_id: str, body: str, signing_secrets: Sequence[str]) -> dict[str, str]:
    """The Standard Webhooks headers of one attempt to send `body` (a str: the exact bytes sent)."""
    if not signing_secrets:
        # Never sent unsigned: the tenant's secret cannot be opened (IDEMOPS_SECRET_KEY changed).
        raise DeliveryFailed("no usable webhook signing secret for this tenant: rotate it in the console")
    sent_at = int(time.time())  # the receiver compares it with its own clock (5 minutes' tolerance)
    when = datetime.fromtimestamp(sent_at, tz=UTC)
    return {"webhook-id": event_id, "webhook-timestamp": str(sent_at),
            "webhook-signature": " ".join(Webhook(secret).sign(event_id, when, body) for secret in signing_secrets)}


def _post_webhook(event: OutboxEvent, body: dict[str, Any], signing_secrets: Sequence[str]) -> None:
    payload = event.payload
    # The stored URL is checked again, against today's allow-list, and the
    # request goes to the address that check resolved (no second DNS answer).
    try:
        target = url_allowlist.check(payload["recipient"], conf().webhook_allowed_prefixes,
                                     field="recipient")
    except InvalidInput as exc:
        raise DeliveryRefused(exc.message) from exc
    except Transient as exc:
        raise DeliveryFailed(exc.message) from exc
    content = json.dumps(body)
    signed = signature_headers(str(event.id), content, signing_secrets)
    try:
        with httpx2.Client(timeout=conf().webhook_timeout_seconds) as client:
            response = target.send(client, "POST", content=content.encode(),
                                   headers={"Content-Type": "application/json", **signed,
                                            "X-Event-Id": str(event.id), "Idempotency-Key": str(event.id),
                                            **operation_header(event)})
    except httpx2.TransportError as exc:
        raise DeliveryFailed(type(exc).__name__) from exc
    if not response.is_success:  # a redirect too: it is never followed
        raise DeliveryFailed(f"HTTP {response.status_code}")
