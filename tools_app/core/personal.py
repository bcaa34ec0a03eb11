"""Personal values encrypted where they are stored (envelope encryption), and forgotten with their key.

The values of the arguments tools declare personal (`personal_fields`, core.redaction.declare_personal:
the one list logs are redacted by) are stored encrypted, at any depth of a stored JSON value, under a
name tools declared personal. Each becomes an envelope

    {"$personal": "v1:<data key id>:<base64 of nonce + AES-GCM ciphertext>"}

under the data key of its tenant and retention period (core.keystore: the day its retention ends); the
ciphertext is bound to the key id and the tenant (associated data). Nothing else changes: fingerprints,
field digests and search attributes are computed from the call's values before anything is stored.

The seam is the storage layer: `PersonalJSONField` (a JSONField) encrypts a value wrapped in `Sealing`
(a dict that says whose it is and how long it is kept) as it is written, and opens every envelope as it is
read. What it reads back:

- the value itself, for whoever reads the row (the engine's replay, the console, the auditors' API and
  exports choose what to show: `shown`);
- `[forgotten]` (FORGOTTEN) when its data key was destroyed (retention purge: crypto-shredding);
- `[unreadable]` (UNREADABLE) when the ciphertext is damaged or names no key of the key store: reported
  in the log (`personal.unreadable`), never an error.

The key store cannot be reached: a write raises `KeyStoreUnavailable` (a `transient` failure) before
anything is written; so does a read that needs a key this process does not hold, so an agent retries
rather than hears a stand-in for its result.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import uuid
from datetime import date, datetime, timedelta
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from django.db import models
from django.utils import timezone

from idemops.conf import conf
from tools_app.core import keystore, redaction

logger = logging.getLogger(__name__)

MARK = "$personal"
VERSION = "v1"
FORGOTTEN = "[forgotten]"
UNREADABLE = "[unreadable]"
PERSONAL = redaction.PERSONAL


class Sealing(dict[str, Any]):
    """A JSON object to be stored with its personal values encrypted: whose (tenant) and until when its
    values are kept (`period`, the day their retention ends). Reads as the plain dict it holds."""

    def __init__(self, value: dict[str, Any], *, tenant_id: int, period: date) -> None:
        super().__init__(value)
        self.tenant_id = tenant_id
        self.period = period


def period_for(kept: timedelta, now: datetime | None = None) -> date:
    """The retention period of values written `now` and kept `kept`: the day their retention ends."""
    return ((now or timezone.now()) + kept).date()


def sealing(value: Any, tenant_id: int, kept: timedelta) -> Any:
    """`value` marked to be stored encrypted (a dict holding a personal name at any depth), else `value`."""
    if not conf().encrypt_personal_values:
        return value  # the benchmark's comparison only (production refuses it)
    if isinstance(value, dict) and _holds_personal(value, redaction.personal_fields()):
        return Sealing(value, tenant_id=tenant_id, period=period_for(kept))
    return value


def _holds_personal(value: Any, names: frozenset[str]) -> bool:
    if isinstance(value, dict):
        return any((name in names and item is not None) or _holds_personal(item, names)
                   for name, item in value.items())
    if isinstance(value, list):
        return any(_holds_personal(item, names) for item in value)
    return False


def _aad(key_id: uuid.UUID, tenant_id: int) -> bytes:
    return f"idemops-personal\n{key_id}\n{tenant_id}".encode()


def encrypt(value: Any, key: keystore.DataKey) -> dict[str, str]:
    assert key.key is not None
    nonce = os.urandom(keystore.NONCE_BYTES)
    plain = json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
    sealed = nonce + AESGCM(key.key).encrypt(nonce, plain, _aad(key.id, key.tenant_id))
    return {MARK: f"{VERSION}:{key.id}:{base64.b64encode(sealed).decode()}"}


def seal(value: Sealing) -> dict[str, Any]:
    """`value` as it is stored: each value under a personal name an envelope (one data key fetch at most)."""
    names = redaction.personal_fields()
    key = keystore.for_period(value.tenant_id, value.period)

    def walk(item: Any) -> Any:
        if isinstance(item, dict):
            if MARK in item:
                return item  # sealed already
            return {name: (encrypt(inner, key) if name in names and inner is not None else walk(inner))
                    for name, inner in item.items()}
        if isinstance(item, list):
            return [walk(inner) for inner in item]
        return item

    sealed: dict[str, Any] = walk(dict(value))
    return sealed


def is_envelope(value: Any) -> bool:
    return isinstance(value, dict) and len(value) == 1 and isinstance(value.get(MARK), str)


def _open_envelope(text: str) -> Any:
    try:
        version, key_text, body = text.split(":", 2)
        key_id = uuid.UUID(key_text)
        sealed = base64.b64decode(body, validate=True)
        if version != VERSION:
            raise ValueError(version)
    except ValueError:
        logger.error("personal.unreadable", extra={"reason": "malformed envelope"})
        return UNREADABLE
    key = keystore.by_id(key_id)
    if key is None:
        logger.error("personal.unreadable", extra={"reason": "no such data key", "data_key": str(key_id)})
        return UNREADABLE
    if key.key is None:
        return FORGOTTEN
    try:
        plain = AESGCM(key.key).decrypt(sealed[:keystore.NONCE_BYTES], sealed[keystore.NONCE_BYTES:],
                                        _aad(key_id, key.tenant_id))
        return json.loads(plain)
    except (InvalidTag, ValueError):
        logger.error("personal.unreadable", extra={"reason": "damaged ciphertext", "data_key": str(key_id)})
        return UNREADABLE


def opened(value: Any) -> Any:
    """`value` as read from storage: every envelope in it opened (or FORGOTTEN, UNREADABLE)."""
    if isinstance(value, dict):
        if is_envelope(value):
            return _open_envelope(value[MARK])
        return {name: opened(item) for name, item in value.items()}
    if isinstance(value, list):
        return [opened(item) for item in value]
    return value


def holds_envelope(value: Any) -> bool:
    if isinstance(value, dict):
        return is_envelope(value) or any(holds_envelope(item) for item in value.values())
    if isinstance(value, list):
        return any(holds_envelope(item) for item in value)
    return False


def shown(value: Any, allowed: bool) -> Any:
    """`value` (as read) for a reader: whole if `allowed` to see personal values, else each value under a
    personal name `[personal]` (forgotten and unreadable ones say so to everyone)."""
    if allowed:
        return value
    names = redaction.personal_fields()

    def walk(item: Any) -> Any:
        if isinstance(item, dict):
            return {name: (inner if inner in (FORGOTTEN, UNREADABLE, None) else PERSONAL) if name in names
                    else walk(inner) for name, inner in item.items()}
        if isinstance(item, list):
            return [walk(inner) for inner in item]
        return item

    return walk(value)


class PersonalJSONField(models.JSONField):
    """A JSONField whose `Sealing` values are stored with their personal values encrypted, and whose
    envelopes are opened when read (core.personal)."""

    def get_db_prep_value(self, value: Any, connection: Any, prepared: bool = False) -> Any:
        if isinstance(value, Sealing):
            value = seal(value)
        return super().get_db_prep_value(value, connection, prepared)

    def from_db_value(self, value: Any, expression: Any, connection: Any) -> Any:
        found = super().from_db_value(value, expression, connection)
        if (isinstance(value, str) and MARK in value) or (not isinstance(value, str) and holds_envelope(found)):
            return opened(found)
        return found
