"""What leaves the operators' view: free text withheld, URLs without their secrets.

One place decides, so every export and every stored copy agrees:

- `failure_text`: a failure message as the auditors' API shows it. Handlers
  and downstream systems quote the caller's input in failure messages (a
  payee, an address, a line of a document), so exports withhold it; the
  class says what happened, and operators read the text in the admin.
- `event_reason`: an audit event's reason as exported. A person's reason
  (an approval, a rejection, a force-expire) is written for auditors and is
  kept; text the system or an agent wrote (failure messages, an agent's
  cancel note) is withheld like any failure text.
- `public_url` / `scrub_urls`: URLs as they may be stored and shown, without
  query, fragment or userinfo, where signed-URL tokens and credentials live.
- `seal` / `unseal`: the few argument values a worker needs in full later
  (a document URL with its token) travel to it encrypted (Fernet, keyed from
  IDEMOPS_SECRET_KEY), never in the clear; see docs/tasks.md.
- `redact_log_line`: what every log line passes (core.logs) before it is written: bearer
  tokens and auditor keys, passwords and other secret fields, raw idempotency keys (their
  keyed digest instead), the arguments tools declare personal (`declare_personal`), the
  values of the current call that must not leak (core.logs.scrubbing), and URLs' queries.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings

from tools_app.core.errors import InvalidInput
from tools_app.core.keys import key_digest

WITHHELD = "[withheld]"
PERSON_PREFIX = "user:"  # tools_app.core.audit.user_actor
SEAL_LABEL = b"idemops:sealed-arguments"


def failure_text(text: str) -> str:
    """A failure message as exports show it: withheld if there is one."""
    return WITHHELD if text else ""


def event_reason(actor: str, reason: str) -> str:
    """An audit event's reason as exports show it: a person's own words, else withheld."""
    return reason if actor.startswith(PERSON_PREFIX) else failure_text(reason)


# --- URLs ------------------------------------------------------------------------------------


def public_url(raw: str) -> str:
    """`raw` without query, fragment and userinfo (they may carry tokens and passwords)."""
    url = urlsplit(raw)
    return urlunsplit((url.scheme, url.netloc.rpartition("@")[2], url.path, "", ""))


def _secret_bearing_url(value: str) -> bool:
    if not value.startswith(("http://", "https://")) or any(c.isspace() for c in value):
        return False
    try:
        url = urlsplit(value)
    except ValueError:
        return False
    return bool(url.query or url.fragment or "@" in url.netloc)


def scrub_urls(value: Any) -> Any:
    """`value` (JSON) with every http(s) URL string reduced to its public form, at any depth."""
    if isinstance(value, str):
        return public_url(value) if _secret_bearing_url(value) else value
    if isinstance(value, dict):
        return {key: scrub_urls(item) for key, item in value.items()}
    if isinstance(value, list):
        return [scrub_urls(item) for item in value]
    return value


def split_secrets(arguments: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(what may be stored in the clear, the top-level values scrubbing changed) of `arguments`."""
    shown = scrub_urls(arguments)
    return shown, {name: value for name, value in arguments.items() if shown[name] != value}


# --- sealing -------------------------------------------------------------------------------------


def _fernet_key(secret: str) -> bytes:
    return base64.urlsafe_b64encode(hmac.new(secret.encode(), SEAL_LABEL, hashlib.sha256).digest())


def _fernet() -> MultiFernet:
    # SECRET_KEY_FALLBACKS (Django's rotation setting) still open what older keys sealed.
    secrets = [settings.SECRET_KEY, *getattr(settings, "SECRET_KEY_FALLBACKS", [])]
    return MultiFernet([Fernet(_fernet_key(secret)) for secret in secrets])


def seal(values: dict[str, Any]) -> str:
    """`values` encrypted and authenticated; "" for nothing to seal."""
    if not values:
        return ""
    return _fernet().encrypt(json.dumps(values, sort_keys=True).encode()).decode()


def unseal(token: str) -> dict[str, Any]:
    if not token:
        return {}
    try:
        values: dict[str, Any] = json.loads(_fernet().decrypt(token.encode()))
        return values
    except InvalidToken:
        raise InvalidInput("the task's sealed arguments cannot be opened (IDEMOPS_SECRET_KEY changed and the old "
                           "key is not in IDEMOPS_SECRET_KEY_FALLBACKS); start a new task with a new idempotency_key"
                           ) from None


# --- log lines ---------------------------------------------------------------------------------

REDACTED = "[redacted]"
PERSONAL = "[personal]"
# Shorter values are not scrubbed from free text: they would mangle the line ("EUR", "yes")
# and say little about a person on their own.
MIN_SCRUBBED_LENGTH = 4

# Field names whose value is a secret, whatever it looks like.
_SECRET_FIELD = re.compile(r"pass(word|wd|phrase)?$|secret|token|authori[sz]ation|api_?key|cookie|session_?id|csrf"
                           r"|credential|private_?key", re.IGNORECASE)
_KEY_FIELDS = frozenset({"idempotency_key", "key", "downstream_key"})
# Secrets in free text: idemops' own bearer secrets (tools_app.access.secrets: agents' `idm_`
# tokens, auditors' `ida_` keys), any bearer credential, `password=...` pairs, and URLs (their
# query and userinfo, where signed-URL tokens and passwords live).
_ISSUED_SECRET = re.compile(r"\b(?:idm|ida)_[A-Za-z0-9_-]{8,}")
_BEARER = re.compile(r"\b(Bearer|Basic|Token)\s+[A-Za-z0-9._~+/=-]{6,}", re.IGNORECASE)
_PASSWORD_PAIR = re.compile(r"\b(pass(?:word|wd)?|pwd|secret|token)(\s*[=:]\s*)(?!\[redacted\])[^\s&,;'\"]+",
                            re.IGNORECASE)
_URL = re.compile(r"\b[a-z][a-z0-9+.-]*://[^\s'\"<>]+", re.IGNORECASE)

_personal_fields: set[str] = set()


def declare_personal(names: Iterable[str]) -> None:
    """Argument names a tool declares personal: such a field's value is never logged (toolkit.registry)."""
    _personal_fields.update(names)


def personal_fields() -> frozenset[str]:
    return frozenset(_personal_fields)


def _url_without_secrets(match: re.Match[str]) -> str:
    url = match.group(0)
    try:
        parts = urlsplit(url)
    except ValueError:
        return REDACTED
    host = parts.netloc.rpartition("@")[2]
    user = parts.netloc.rpartition("@")[0].partition(":")[0]
    netloc = f"{user}:{REDACTED}@{host}" if "@" in parts.netloc else host
    query = "?" + REDACTED if parts.query else ""
    return urlunsplit((parts.scheme, netloc, parts.path, "", "")) + query


def redact_text(text: str, scrubbed: tuple[tuple[str, str], ...] = ()) -> str:
    for value, stand_in in scrubbed:
        if value in text:
            text = text.replace(value, stand_in)
    if "://" in text:
        text = _URL.sub(_url_without_secrets, text)
    text = _ISSUED_SECRET.sub(REDACTED, text)
    text = _BEARER.sub(lambda m: f"{m.group(1)} {REDACTED}", text)
    return _PASSWORD_PAIR.sub(lambda m: f"{m.group(1)}{m.group(2)}{REDACTED}", text)


def _digest_of(value: Any) -> str:
    try:
        return f"[key {key_digest(str(value))}]"
    except Exception:  # settings not loaded yet (a line logged during start-up): say nothing of it
        return REDACTED


def _redact(name: str, value: Any, scrubbed: tuple[tuple[str, str], ...]) -> Any:
    if value is None or isinstance(value, bool | int | float):
        return value
    if name in _personal_fields:
        return PERSONAL
    if _SECRET_FIELD.search(name):
        return REDACTED
    if name in _KEY_FIELDS and isinstance(value, str):
        return _digest_of(value)
    if isinstance(value, dict):
        return {key: _redact(str(key), item, scrubbed) for key, item in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_redact(name, item, scrubbed) for item in value]
    return redact_text(value if isinstance(value, str) else str(value), scrubbed)


def redact_log_line(event: Mapping[str, Any], scrubbed: tuple[tuple[str, str], ...] = ()) -> dict[str, Any]:
    """`event` (a log line's fields) as it may be written."""
    return {key: _redact(key, value, scrubbed) for key, value in event.items()}


def scrubbed_arguments(arguments: Any, personal: Iterable[str], key: str | None = None) -> list[tuple[str, str]]:
    """The values of a call that no log line may show, with their stand-ins: its raw key and every
    string inside its personal arguments (nested ones included)."""
    values: list[tuple[str, str]] = []
    if key:
        values.append((key, _digest_of(key)))
    personal = set(personal)

    def strings(value: Any) -> Iterable[str]:
        if isinstance(value, str):
            yield value
        elif isinstance(value, dict):
            for item in value.values():
                yield from strings(item)
        elif isinstance(value, list | tuple):
            for item in value:
                yield from strings(item)

    for name, value in (arguments or {}).items():
        if name in personal:
            values += [(text, PERSONAL) for text in strings(value)]
    # Longest first: a value that contains another is replaced whole.
    return sorted(values, key=lambda pair: -len(pair[0]))


def without_personal(text: str, arguments: Any, personal: Iterable[str]) -> str:
    """`text` written from a call's arguments (an approval's summary) without the values of its personal
    arguments: what may travel to people and systems outside the console, and stay past retention."""
    scrubbed = tuple(pair for pair in scrubbed_arguments(arguments, personal) if len(pair[0]) >= MIN_SCRUBBED_LENGTH)
    return redact_text(text, scrubbed)
