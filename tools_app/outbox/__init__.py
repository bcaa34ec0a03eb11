"""The transactional outbox: messages written in the transaction of the business change and
delivered at least once by a relay, each consumer deduplicating by the event id.

`channels.py` keeps tenants' Apprise channels (Slack, Teams, PagerDuty, ...; URLs sealed);
`relay.py` writes events (`enqueue`), relays due batches, records each attempt
(backoff, dead letters) and lets an operator re-drive a dead letter behind its
Permit; `delivery.py` delivers one event (SMTP, an allow-listed webhook, or a channel through Apprise);
`jobs.py` is the django-q2 entry point.

May import: core, access.
"""

from tools_app.outbox.channels import CHANGE_CHANNEL, CHANNEL_KIND, channels_of, save_channel
from tools_app.outbox.delivery import DeliveryFailed, DeliveryRefused, deliver
from tools_app.outbox.jobs import relay_pending
from tools_app.outbox.relay import (
    REDRIVE,
    RELAY_ACTOR,
    RelayReport,
    enqueue,
    find,
    mark_delivered,
    record_failed_attempt,
    redrive,
    relay_batch,
    relay_one,
)

__all__ = [
    "CHANGE_CHANNEL", "CHANNEL_KIND", "channels_of", "save_channel",
    "REDRIVE", "RELAY_ACTOR", "DeliveryFailed", "DeliveryRefused", "RelayReport", "deliver", "enqueue", "find",
    "mark_delivered", "record_failed_attempt", "redrive", "relay_batch", "relay_one", "relay_pending",
]
