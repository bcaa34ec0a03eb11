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
from typing import TYPE_CHECKING, Any, TypeVar, cast

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import BinaryField, Case, CharField, Expression, Func, Model, QuerySet, Value, When
from django.db.models.functions import Concat, Left, Substr

from tools_app.conf import conf
from tools_app.core import jsontext
from tools_app.core.errors import InvalidInput

if TYPE_CHECKING:
    from django.db.models.sql.compiler import SQLCompiler

_M = TypeVar("_M", bound=Model)

KEY_PATTERN = re.compile(r"[A-Za-z0-9._:-]{1,255}")


KEY_RULE = "idempotency_key must be 1-255 characters from A-Z a-z 0-9 . _ : -"


META_KEY = "io.idemops/idempotency-key"


def validate_key(key: Any) -> str:
    if not isinstance(key, str) or not KEY_PATTERN.fullmatch(key):
        raise InvalidInput(f"invalid idempotency_key: {KEY_RULE}")
    return key


KEY_DIGEST_LENGTH = 16


def key_digest_secret() -> bytes:
    secret = conf().key_digest_secret
    assert secret is not None, "idemops.settings derives KEY_DIGEST_SECRET when it is unset"
    return secret.get_secret_value().encode()


def keyed_hash(message: str) -> str:
    """HMAC-SHA256 of `message` under the server's KEY_DIGEST_SECRET, as hex.

    Keyed, not a plain hash: keys are often order numbers or e-mail addresses,
    and a plain SHA-256 of those falls to a dictionary in seconds.
    """
    return hmac.new(key_digest_secret(), message.encode(), hashlib.sha256).hexdigest()


def key_digest(key: str) -> str:
    """How a key appears outside the database (admin, auditors' API, logs): never raw."""
    if key.startswith(PURGED_KEY_PREFIX):
        return key[len(PURGED_KEY_PREFIX):][:KEY_DIGEST_LENGTH]
    return keyed_hash(key)[:KEY_DIGEST_LENGTH]


# A record past its retention keeps its key only as this keyed hash (retention.purge): a key is
# often the caller's words (an e-mail address, an order number). "#" is outside KEY_PATTERN, so no
# caller's key looks like a purged one; the engine looks a key up in both forms, so a purged key
# still follows its tool's expiry policy. Changing KEY_DIGEST_SECRET forgets purged keys.
PURGED_KEY_PREFIX = "#"


def purged_key(key: str) -> str:
    """The form a key is kept in once its record is purged."""
    return key if key.startswith(PURGED_KEY_PREFIX) else PURGED_KEY_PREFIX + keyed_hash(key)


def stored_forms(key: str) -> tuple[str, str]:
    """Every form `key` may be stored in: raw (live) and purged."""
    return key, purged_key(key)


def purged_key_sql(column: str = "key") -> Expression:
    """purged_key of a column, computed by the database (the raw key never reaches this process)."""
    return Case(When(**{f"{column}__startswith": PURGED_KEY_PREFIX}, then=column),
                default=Concat(Value(PURGED_KEY_PREFIX), HmacSha256Hex(column, key_digest_secret())),
                output_field=CharField())


class HmacSha256Hex(Func):
    """HMAC-SHA256 of a text column under `secret`, as lowercase hex, in SQL.

    RFC 2104 spelled out with PostgreSQL's built-in sha256(), H((K^opad) || H((K^ipad) || m)),
    so the database needs no extension (pgcrypto's hmac()). It equals
    keyed_hash (a test holds them together).
    """

    output_field = CharField()

    def __init__(self, expression: str | Expression, secret: bytes) -> None:
        block = hashlib.sha256().block_size
        key = (hashlib.sha256(secret).digest() if len(secret) > block else secret).ljust(block, b"\0")
        pads = (bytes(b ^ 0x5C for b in key), bytes(b ^ 0x36 for b in key))
        super().__init__(*(Value(pad, output_field=BinaryField()) for pad in pads), expression)

    def as_sql(self, compiler: SQLCompiler, connection: BaseDatabaseWrapper, function: str | None = None,
               template: str | None = None, arg_joiner: str | None = None,
               **extra_context: Any) -> tuple[str, tuple[Any, ...]]:
        (outer, outer_params), (inner, inner_params), (text, text_params) = (
            compiler.compile(e) for e in self.get_source_expressions())
        sql = f"ENCODE(SHA256({outer}::bytea || SHA256({inner}::bytea || CONVERT_TO({text}, 'UTF8'))), 'hex')"
        return sql, (*outer_params, *inner_params, *text_params)


def with_key_digest(records: QuerySet[_M], digest_: str) -> QuerySet[_M]:
    """The records among `records` whose key has the digest `digest_` (as key_digest shows it).

    Computed per row of the (tenant-scoped, otherwise filtered) queryset: a scan, correct for any
    secret; an indexed digest column would need rewriting whenever the secret changes.
    """
    computed = Case(When(key__startswith=PURGED_KEY_PREFIX,
                         then=Substr("key", len(PURGED_KEY_PREFIX) + 1, KEY_DIGEST_LENGTH)),
                    default=Left(HmacSha256Hex("key", key_digest_secret()), KEY_DIGEST_LENGTH),
                    output_field=CharField())
    # django-stubs' plugin loses the model of an annotated queryset whose model is a type variable.
    return cast("QuerySet[_M]", records.annotate(_key_digest=computed).filter(_key_digest=digest_))


def canonical_json(value: Any) -> str:
    """JSON with sorted keys, NFC strings and normalized numbers (1 == 1.0 == 1.00).

    Most arguments are plain (ASCII text, small integers, booleans, nulls, lists and dicts of them):
    for those the standard library's C encoder writes the same bytes (an ASCII string is its own NFC
    form, an integer below 10**28 its own normalized number), several times faster than the walk
    below. Most others (decimal amounts, text in other scripts, dates) are handed to it with each such
    part replaced by what it writes as the walk does (`_encodable`); the rest are walked.
    tests/core/test_fingerprint.py holds the three to the same bytes."""
    if _plain(value):
        return _PLAIN_ENCODER(value)
    try:
        return _PLAIN_ENCODER(_encodable(value))
    except _Walk:
        return _canonical(value)


# Sorted keys, no spaces, text as it is: the bytes `_canonical` writes for a plain value.
_PLAIN_ENCODER = jsontext.encoder(sort_keys=True, ensure_ascii=False, compact=True)
# Decimal's default context keeps 28 digits: `_canonical_number` rounds a longer integer, so the
# encoder's exact digits would differ (a quirk every stored fingerprint already has).
_PLAIN_INTEGER_BOUND = 10**28


def _plain(value: Any) -> bool:
    """Whether the C encoder writes `value`'s canonical form (exact types only: a subclass may print
    itself otherwise)."""
    kind = type(value)
    if kind is str:
        return bool(value.isascii())
    if kind is int:
        return bool(-_PLAIN_INTEGER_BOUND < value < _PLAIN_INTEGER_BOUND)
    if value is None or kind is bool:
        return True
    if kind is dict:
        for key, item in value.items():
            if type(key) is not str or not key.isascii() or not _plain(item):
                return False
        return True
    if kind is list or kind is tuple:
        for item in value:
            if not _plain(item):
                return False
        return True
    return False


class _Walk(Exception):
    """A value whose canonical form the C encoder cannot be handed: `_canonical` walks it."""


def _encodable(value: Any) -> Any:
    """`value` with each part the C encoder would write otherwise replaced by one it writes as the walk
    does: text in NFC, a number by the value whose JSON is its normalized form (an int, or a float whose
    repr is that form), a date, time or UUID by its text. _Walk where none is (a float whose repr is in
    exponent notation, two keys with one NFC form, a type of its own...)."""
    kind = type(value)
    if kind is str:
        return _nfc(value)
    if value is None or kind is bool:
        return value
    if kind is int or kind is float or kind is Decimal:
        return _number_as_encoded(value)
    if kind is dict:
        return _encodable_dict(value)
    if kind is list or kind is tuple:
        return [_encodable(item) for item in value]
    if kind is datetime:
        return (value.astimezone(UTC) if value.tzinfo else value).isoformat()
    if kind is date or kind is uuid.UUID:
        return str(value)
    raise _Walk


def _nfc(text: str) -> str:
    return text if text.isascii() else unicodedata.normalize("NFC", text)


def _encodable_dict(value: dict[Any, Any]) -> dict[str, Any]:
    encodable = {}
    for key, item in value.items():
        if type(key) is not str:
            raise _Walk
        encodable[_nfc(key)] = _encodable(item)
    if len(encodable) != len(value):  # two keys with one NFC form: the walk orders them by their values
        raise _Walk
    return encodable


def _number_as_encoded(value: int | float | Decimal) -> int | float:
    """The int or float the C encoder writes as `value`'s normalized form."""
    if type(value) is int and -_PLAIN_INTEGER_BOUND < value < _PLAIN_INTEGER_BOUND:
        return value
    try:
        text = _canonical_number(value)
        if "." not in text:
            return int(text)  # its repr is the text: no sign of zero, no leading zeros
        number = float(text)
    except (InvalidInput, ValueError):  # not finite, or more digits than int() reads: the walk says
        raise _Walk from None
    if repr(number) != text:
        raise _Walk
    return number


def _canonical(value: Any) -> str:
    """canonical_json of any value, walked in Python."""
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
    return digest_of_canonical(canonical_json(value))


def digest_of_canonical(text: str) -> str:
    """digest() of the value whose canonical_json is `text`."""
    return hashlib.sha256(text.encode()).hexdigest()


# What a fingerprint covers, by version (a record keeps the version it was claimed under, and a later
# call with its key is compared under that version: a deploy that changes how arguments are
# fingerprinted changes nothing for keys already in use).
# 1: the validated arguments with every default filled in (before versions): a deploy adding an
#    optional argument changed the fingerprint of every live key.
FINGERPRINT_FILLED = 1
# 2: the arguments the caller sent, at every level, as validated (normalised values), without the
#    defaults of what it left out. A tool's declared counted defaults are versions 3, 4, ... (one per
#    fixed set: toolkit.registry.ToolSpec.counted_defaults).
FINGERPRINT_AS_SENT = 2
