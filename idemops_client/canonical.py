"""Canonical arguments, fingerprints and derived idempotency keys.

`canonical_json` is the server's canonical form (idemops
`tools_app/idempotency.py`), rebuilt here so the package needs nothing from
the server: sorted keys, NFC strings, numbers normalised so that
1 == 1.0 == 1.00. Two calls whose arguments differ only in key order,
Unicode composition or number spelling have one canonical form, hence one
fingerprint and one derived key. A test checks both implementations on a
shared table of vectors.
"""

from __future__ import annotations

import hashlib
import json
import unicodedata
import uuid
from collections.abc import Mapping
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

# Arguments every idemops write tool takes that are not part of the operation.
ENGINE_FIELDS = frozenset({"idempotency_key", "trace_id"})
DERIVED_KEY_PREFIX = "ik-"


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
        raise ValueError("numbers must be finite")
    if number == 0:
        return "0"
    return format(number.normalize(), "f")


def fingerprint(arguments: Mapping[str, Any]) -> str:
    return hashlib.sha256(canonical_json(arguments).encode()).hexdigest()


def business_arguments(arguments: Mapping[str, Any], non_business: frozenset[str] = frozenset()) -> dict[str, Any]:
    """What identifies the operation: the arguments without engine and declared non-business fields."""
    excluded = ENGINE_FIELDS | non_business
    return {name: value for name, value in arguments.items() if name not in excluded}


def derive_key(session_id: str, tool: str, business: Mapping[str, Any]) -> str:
    """The key a call gets when the caller gives none: the same (session, tool, arguments) give the same key.

    The session is part of it: the same order placed in another conversation is
    another operation. The result matches the server's key rule
    ([A-Za-z0-9._:-], at most 255 characters).
    """
    material = json.dumps([session_id, tool, canonical_json(business)], ensure_ascii=False)
    return DERIVED_KEY_PREFIX + hashlib.sha256(material.encode()).hexdigest()[:40]
