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

from tools_app.conf import conf
from tools_app.core import jsontext, keystore, redaction

logger = logging.getLogger(__name__)

MARK = "$personal"
VERSION = "v1"
FORGOTTEN = "[forgotten]"
UNREADABLE = "[unreadable]"
PERSONAL = redaction.PERSONAL


class Sealing(dict[str, Any]):
    """A JSON object to be stored with its personal values encrypted: whose (tenant) and until when its
    values are kept (`period`, the day their retention ends). Reads as the plain dict it holds."""

    def __init__(self, value: dict[str, Any], *, tenant_id: int, period: date, whole: bool = False) -> None:
        super().__init__(value)
        self.tenant_id = tenant_id
        self.period = period
        self.whole = whole  # the whole value one envelope (`sealing_whole`)


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


class SealingList(list[Any]):
    """A JSON list to be stored with its personal values encrypted (`Sealing`'s, for a list a writer appends by
    SQL: a record's evidence, core.db.transition); reads as the plain list it holds."""

    def __init__(self, value: list[Any], *, tenant_id: int, period: date) -> None:
        super().__init__(value)
        self.tenant_id = tenant_id
        self.period = period


def sealing_list(value: list[Any], tenant_id: int, kept: timedelta = timedelta(0)) -> list[Any]:
    """`value` marked to be stored with its personal values encrypted, else `value`."""
    if not conf().encrypt_personal_values or not _holds_personal(value, redaction.personal_fields()):
        return value
    return SealingList(value, tenant_id=tenant_id, period=period_for(kept))


def stored(value: Any) -> Any:
    """What a writer that bypasses the field stores for `value`: a `Sealing` or `SealingList` sealed, else as is."""
    if isinstance(value, Sealing):
        return seal(value)
    if isinstance(value, SealingList):
        return sealed_value(list(value), value.tenant_id, value.period)
    return value


def sealing_whole(value: Any, tenant_id: int, kept: timedelta = timedelta(0)) -> Any:
    """`value` (a dict) marked to be stored as one envelope, whatever its names: what a tool that declares
    personal arguments derives from them (a long tool's step outputs and result, the webhook telling them)."""
    if not conf().encrypt_personal_values or not isinstance(value, dict):
        return value
    return Sealing(value, tenant_id=tenant_id, period=period_for(kept), whole=True)


def whole_for(value: Any, tenant_id: int | None) -> Any:
    """`value` as one envelope now (`sealing_whole`'s, for a writer that bypasses the field)."""
    if not conf().encrypt_personal_values or value is None or is_envelope(value):
        return value
    return encrypt(value, keystore.for_period(tenant_id or 0, period_for(timedelta(0))))


def _holds_personal(value: Any, names: frozenset[str]) -> bool:
    if isinstance(value, dict):
        return any((name in names and item is not None) or _holds_personal(item, names)
                   for name, item in value.items())
    if isinstance(value, list):
        return any(_holds_personal(item, names) for item in value)
    return False


def _aad(key_id: uuid.UUID, tenant_id: int) -> bytes:
    return f"idemops-personal\n{key_id}\n{tenant_id}".encode()


_COMPACT = jsontext.encoder(ensure_ascii=False, compact=True)


def encrypt(value: Any, key: keystore.DataKey) -> dict[str, str]:
    assert key.key is not None
    nonce = os.urandom(keystore.NONCE_BYTES)
    plain = _COMPACT(value).encode()
    sealed = nonce + AESGCM(key.key).encrypt(nonce, plain, _aad(key.id, key.tenant_id))
    return {MARK: f"{VERSION}:{key.id}:{base64.b64encode(sealed).decode()}"}


def seal(value: Sealing) -> dict[str, Any]:
    """`value` as it is stored: each value under a personal name an envelope (one data key fetch at most)."""
    if value.whole:
        return encrypt(dict(value), keystore.for_period(value.tenant_id, value.period))
    sealed: dict[str, Any] = sealed_value(dict(value), value.tenant_id, value.period)
    return sealed


def sealed_value(value: Any, tenant_id: int, period: date) -> Any:
    """`value` (any JSON) with each value under a personal name an envelope of the data key of `tenant_id` and
    `period`, at any depth; values sealed already stay as they are. The key store is asked only when there is
    something to seal."""
    names = redaction.personal_fields()
    if not _holds_personal(value, names):
        return value
    key = keystore.for_period(tenant_id, period)

    def walk(item: Any) -> Any:
        if isinstance(item, dict):
            if MARK in item:
                return item  # sealed already
            return {name: (encrypt(inner, key) if name in names and inner is not None and not is_envelope(inner)
                           else walk(inner)) for name, inner in item.items()}
        if isinstance(item, list):
            return [walk(inner) for inner in item]
        return item

    return walk(value)


def sealed_for(value: Any, tenant_id: int | None, kept: timedelta = timedelta(0)) -> Any:
    """`value` as stored by a writer that bypasses the field (raw SQL, a checkpoint's text): sealed now, under
    the data key of `tenant_id` and of the period ending `kept` from now (`sealing`'s rule)."""
    if not conf().encrypt_personal_values:
        return value
    return sealed_value(value, tenant_id or 0, period_for(kept))


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


VIEW_PERSONAL_VALUES = "tools_app.view_personal_values"


def masked(instance: models.Model) -> models.Model:
    """`instance` as shown to a reader not allowed to see personal values (without VIEW_PERSONAL_VALUES): each
    of its stored values under a personal name `[personal]` (`shown`), in memory only. `[forgotten]` and
    `[unreadable]` show as such to everyone."""
    for field in instance._meta.concrete_fields:
        if isinstance(field, PersonalJSONField):
            setattr(instance, field.attname, shown(getattr(instance, field.attname), allowed=False))
    return instance


def personal_columns() -> list[tuple[str, str]]:
    """(table, column) of every PersonalJSONField of the installed models: where envelopes are stored, so
    where the purge looks for the data keys still needed (retention.purge.shred)."""
    from django.apps import apps

    found = {(model._meta.db_table, field.column) for model in apps.get_models()
             if not model._meta.proxy for field in model._meta.concrete_fields
             if isinstance(field, PersonalJSONField) and field.column}
    return sorted((table, str(column)) for table, column in found)


def _tenant_of(instance: models.Model) -> int | None:
    """Whose values an instance holds: its tenant, or its task's (a step's batch)."""
    if (tenant_id := getattr(instance, "tenant_id", None)) is not None:
        return int(tenant_id)
    task = getattr(instance, "task", None) if getattr(instance, "task_id", None) is not None else None
    return getattr(task, "tenant_id", None)


class PersonalJSONField(models.JSONField):
    """A JSONField whose personal values are stored encrypted (core.personal), and whose envelopes are opened
    when read.

    A `Sealing` value is sealed under its own tenant and period (the engine's records: their retention). Any
    other value a model instance saves (save, create, bulk_create) is sealed under the instance's tenant
    (`tenant_id`) and the period of the day it is written: its data key is destroyed by the purge once that day
    is past and no row holds a value under it any more (retention.purge.shred). Writers that bypass the model
    (QuerySet.update, raw SQL) pass a `Sealing` or `sealed_for`'s value."""

    def pre_save(self, model_instance: models.Model, add: bool) -> Any:
        value = super().pre_save(model_instance, add)
        if isinstance(value, dict | list) and not isinstance(value, Sealing):
            return sealed_for(value, _tenant_of(model_instance))
        return value

    def get_db_prep_value(self, value: Any, connection: Any, prepared: bool = False) -> Any:
        if isinstance(value, Sealing):
            value = seal(value)
        return super().get_db_prep_value(value, connection, prepared)

    def from_db_value(self, value: Any, expression: Any, connection: Any) -> Any:
        found = super().from_db_value(value, expression, connection)
        if (isinstance(value, str) and MARK in value) or (not isinstance(value, str) and holds_envelope(found)):
            return opened(found)
        return found
