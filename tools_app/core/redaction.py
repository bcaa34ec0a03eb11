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
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings

from tools_app.core.errors import InvalidInput

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
        return json.loads(_fernet().decrypt(token.encode()))
    except InvalidToken:
        raise InvalidInput("the task's sealed arguments cannot be opened (IDEMOPS_SECRET_KEY changed and the old "
                           "key is not in IDEMOPS_SECRET_KEY_FALLBACKS); start a new task with a new idempotency_key"
                           ) from None
