"""Bearer secrets: agents' API tokens and auditor keys, issued, checked and revoked the same way.

- Issued once (`new`): 256 random bits behind a kind prefix (`idm_`, `ida_`). The raw value is
  returned to whoever issues it and never stored or shown again; the row keeps its SHA-256
  digest and its first characters, so an operator recognises it.
- Checked (`find`): by the digest of what was presented, among unrevoked rows. A plain unsalted
  digest is enough for 256-bit random values (no dictionary to try), and it can be indexed, so
  a check is one indexed read. No constant-time comparison is needed: the database compares
  digests, and how long that takes tells an attacker about the SHA-256 of their own guess, not
  about any stored secret.
- Last use (`find`): refreshed at most once per LAST_USED_RESOLUTION, so checking the token of
  every MCP call stays a read.
- Revoked (`revoke`): one guarded transition with its audit event; a revoked secret stays revoked.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, TypeVar

from django.db import models
from django.utils import timezone

from tools_app.core import db

if TYPE_CHECKING:
    from tools_app.access.models import ApiToken, AuditorKey

_Secret = TypeVar("_Secret", "ApiToken", "AuditorKey")

RANDOM_BYTES = 32
SHOWN_CHARACTERS = 12
# last_used_at is informational; refreshing it at most this often keeps every check a read.
LAST_USED_RESOLUTION = timedelta(minutes=1)


@dataclass(frozen=True)
class Issued:
    raw: str  # give it to the holder now: it is never stored
    digest: str  # store this
    prefix: str  # and this, to recognise it


def digest(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


def new(kind_prefix: str) -> Issued:
    """A new secret of a kind (`idm_`, `ida_`)."""
    raw = kind_prefix + secrets.token_urlsafe(RANDOM_BYTES)
    return Issued(raw=raw, digest=digest(raw), prefix=raw[:SHOWN_CHARACTERS])


def find(rows: models.QuerySet[_Secret], raw: str, kind_prefix: str) -> _Secret | None:
    """The live row among `rows` that `raw` stands for (and note its use), or None."""
    if not raw.startswith(kind_prefix):
        return None
    row = rows.filter(digest=digest(raw), revoked_at__isnull=True).first()
    if row is None:
        return None
    now = timezone.now()
    if row.last_used_at is None or row.last_used_at < now - LAST_USED_RESOLUTION:
        type(row).objects.filter(pk=row.pk).update(last_used_at=now)
    return row


def revoke(row: models.Model, *, action: str, actor: str, reason: str = "") -> bool:
    """Revoke a live secret (`action` is its audit event). False: it was revoked already."""
    return db.transition(row, {"revoked_at__isnull": True}, {"revoked_at": timezone.now()},
                         action=action, actor=actor, reason=reason)
