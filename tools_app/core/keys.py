"""Idempotency keys and fingerprints: what a key may look like, how arguments become a fingerprint,
and how a key appears outside the database (a keyed digest, never the raw key).

The canonical form (sorted keys, NFC strings, normalised numbers: 1 == 1.0 == 1.00) is the one
the agent's client (idemops_client.canonical) reproduces to derive the same keys.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import unicodedata
import uuid
from collections.abc import Mapping
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

from idemops.conf import conf
from tools_app.core.errors import InvalidInput

KEY_PATTERN = re.compile(r"[A-Za-z0-9._:-]{1,255}")


KEY_RULE = "idempotency_key must be 1-255 characters from A-Z a-z 0-9 . _ : -"


META_KEY = "io.idemops/idempotency-key"


def validate_key(key: Any) -> str:
    if not isinstance(key, str) or not KEY_PATTERN.fullmatch(key):
        raise InvalidInput(f"invalid idempotency_key: {KEY_RULE}")
    return key


KEY_DIGEST_LENGTH = 16


def key_digest_secret() -> bytes:
    return conf().key_digest_secret.get_secret_value().encode()


def keyed_hash(message: str) -> str:
    """HMAC-SHA256 of `message` under the server's KEY_DIGEST_SECRET, as hex.

    Keyed, not a plain hash: keys are often order numbers or e-mail addresses,
    and a plain SHA-256 of those falls to a dictionary in seconds.
    """
    return hmac.new(key_digest_secret(), message.encode(), hashlib.sha256).hexdigest()


def key_digest(key: str) -> str:
    """How a key appears outside the database (admin, auditors' API, logs): never raw."""
    return keyed_hash(key)[:KEY_DIGEST_LENGTH]


def canonical_json(value: Any) -> str:
    """JSON with sorted keys, NFC strings and normalized numbers (1 == 1.0 == 1.00)."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, (int, float, Decimal)):
        return _canonical_number(value)
    if isinstance(value, str):
        return json.dumps(unicodedata.normalize("NFC", value), ensure_ascii=False)
    if isinstance(value, Mapping):
        items = sorted((unicodedata.normalize("NFC", str(k)), v) for k, v in value.items())
        return "{" + ",".join(f"{json.dumps(k, ensure_ascii=False)}:{canonical_json(v)}" for k, v in items) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(canonical_json(v) for v in value) + "]"
    if isinstance(value, datetime):
        value = value.astimezone(UTC) if value.tzinfo else value
        return json.dumps(value.isoformat())
    if isinstance(value, (date, uuid.UUID)):
        return json.dumps(str(value))
    raise TypeError(f"cannot fingerprint a {type(value).__name__}")


def _canonical_number(value: int | float | Decimal) -> str:
    number = Decimal(str(value)) if isinstance(value, float) else Decimal(value)
    if not number.is_finite():
        raise InvalidInput("numbers must be finite")
    if number == 0:
        return "0"
    return format(number.normalize(), "f")


def digest(value: Any) -> str:
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()
