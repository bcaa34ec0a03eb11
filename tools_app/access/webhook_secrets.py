"""Tenants' webhook signing secrets: every webhook idemops sends for a tenant (approvers' notices,
`send_notification` webhooks, a finished task's `notify_url`) is signed the Standard Webhooks way
with its tenant's secret (tools_app.outbox.delivery signs; a receiver verifies, docs/webhooks.md).

- Stored sealed, not hashed: unlike an API token it must be read back to sign, so it is encrypted
  and authenticated under IDEMOPS_SECRET_KEY (core.redaction.seal), like a task's scrubbed arguments.
- Shown once: `rotate` returns the new secret to the operator who asked (the console shows it in
  that response only); it is never shown again.
- Rotation keeps the previous secret signing too for IDEMOPS_WEBHOOK_SECRET_OVERLAP_SECONDS:
  each webhook then carries both signatures (`webhook-signature` holds several, space-separated),
  so a receiver switches to the new secret within that time without rejecting a delivery.
- A tenant with no secret yet gets one at its first webhook (`signing_secrets`), so nothing leaves
  unsigned; nobody has seen that one: rotate it in the console to get a secret to give receivers.
"""

from __future__ import annotations

import base64
import secrets as random
from collections.abc import Collection
from typing import TYPE_CHECKING

from django.db import transaction

from tools_app.access.authorization import Permit, authorize
from tools_app.access.models import Tenant, WebhookSecret
from tools_app.conf import conf
from tools_app.core import clock, db, redaction
from tools_app.core.errors import InvalidInput

if TYPE_CHECKING:
    from django.contrib.auth.models import AnonymousUser, User

PREFIX = "whsec_"
RANDOM_BYTES = 32
SHOWN_CHARACTERS = 12
SIGNER = "system:webhook-signing"
# Two operators rotating at once: each attempt is a compare-and-swap on the sealed value.
ROTATE_ATTEMPTS = 5

ROTATE = Permit("tools_app.rotate_webhooksecret", "rotate_webhook_secret",
                "create or rotate a tenant's webhook signing secret", "webhook_secret.rotate_refused")


def new_secret() -> str:
    """A Standard Webhooks secret: `whsec_` and the base64 of 256 random bits."""
    return PREFIX + base64.b64encode(random.token_bytes(RANDOM_BYTES)).decode()


def rotate(tenant: Tenant, who: User | AnonymousUser) -> str:
    """An operator creates the tenant's signing secret, or replaces it (the previous one keeps
    signing for the overlap). Returns the new secret: show it now, it is never shown again."""
    # The row exists before the check, so a refusal names it (as access.limits does).
    row, _ = WebhookSecret.objects.get_or_create(tenant=tenant)
    return _rotate(row, authorize(who, ROTATE, row))


def signing_secrets(tenant_ids: Collection[int]) -> dict[int, list[str]]:
    """Tenant id -> the secrets its webhooks are signed with now (the current one, and the
    previous one during the overlap). A tenant without a secret gets one here; one whose secret
    cannot be opened (IDEMOPS_SECRET_KEY changed, the old key dropped) gets none: its webhooks wait."""
    now = clock.read()
    rows = {row.tenant_id: row for row in WebhookSecret.objects.filter(tenant_id__in=set(tenant_ids))}
    result: dict[int, list[str]] = {}
    for tenant_id in set(tenant_ids):
        row = rows.get(tenant_id) or WebhookSecret.objects.get_or_create(tenant_id=tenant_id)[0]
        if not row.sealed:
            _rotate(row, SIGNER)
        try:
            opened = redaction.unseal(row.sealed)
        except InvalidInput:
            result[tenant_id] = []
            continue
        valid = row.previous_valid_until is not None and row.previous_valid_until > now
        result[tenant_id] = [opened["current"], *([opened["previous"]] if "previous" in opened and valid else [])]
    return result


def _rotate(row: WebhookSecret, actor: str) -> str:
    """The one change of a secret: sealed -> a new current secret (the old one as previous), audited."""
    for _ in range(ROTATE_ATTEMPTS):
        try:
            current = redaction.unseal(row.sealed).get("current")
        except InvalidInput:
            current = None  # sealed under a key that is gone: nothing to keep signing with
        raw = new_secret()
        changes = {"sealed": redaction.seal({"current": raw, **({"previous": current} if current else {})}),
                   "prefix": raw[:SHOWN_CHARACTERS], "rotated_at": clock.NOW,
                   "previous_valid_until": clock.later(conf().webhook_secret_overlap_seconds) if current else None}
        with transaction.atomic():
            if db.transition(row, {"sealed": row.sealed}, changes,
                             action="webhook_secret.rotated" if row.sealed else "webhook_secret.created",
                             actor=actor, before={"prefix": row.prefix} if row.prefix else None,
                             after={"prefix": changes["prefix"]}):
                return raw
        row.refresh_from_db()
        if actor == SIGNER and row.sealed:
            return ""  # another process created it first: that one signs
    raise RuntimeError(f"the webhook secret of tenant {row.tenant_id} changed {ROTATE_ATTEMPTS} times meanwhile")
