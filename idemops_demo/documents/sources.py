"""Where a document's bytes come from: text or base64 given inline, or a path or URL on the
allow-lists (IDEMOPS_DOCUMENT_ALLOWED_DIRS, IDEMOPS_DOCUMENT_ALLOWED_URL_PREFIXES, checked by
core.url_allowlist); anything else is refused as invalid_input before a task is created, and
checked again when read.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Callable
from contextlib import closing
from pathlib import Path

import httpx2

from idemops.tools import CheckedUrl, InvalidInput, NotFound, PermissionDenied, Transient, check_url, retry_after_header
from idemops_demo.idemops_settings import DemoSettings

READ_BLOCK = 1024 * 1024


Progress = Callable[[float, float | None, str], None]


def no_progress(done: float, total: float | None = None, message: str = "") -> None:
    pass


def max_bytes() -> int:
    return DemoSettings.current().document_max_bytes


def allowed_path(raw: str) -> Path:
    """The real path of `raw` if it lies inside an allowed directory (symlinks resolved)."""
    path = Path(raw)
    if not path.is_absolute():
        raise InvalidInput("path must be absolute")
    real = path.resolve()
    for directory in DemoSettings.current().document_allowed_dirs:
        if real.is_relative_to(Path(directory).resolve()):
            return real
    raise InvalidInput("path is not under a directory this server may read (IDEMOPS_DOCUMENT_ALLOWED_DIRS)")


def allowed_url(raw: str) -> CheckedUrl:
    """Where `raw` may be fetched from, if it passes IDEMOPS_DOCUMENT_ALLOWED_URL_PREFIXES
    (idemops.tools.check_url)."""
    return check_url(raw, DemoSettings.current().document_allowed_url_prefixes, field="url")


def decode_base64(value: str) -> bytes:
    try:
        data = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidInput("content_base64 is not valid base64") from None
    _check_size(len(data))
    return data


def _check_size(size: int) -> None:
    if size > max_bytes():
        raise InvalidInput(f"the document is larger than the {max_bytes()} bytes this server accepts")


def read_path(raw: str, progress: Progress = no_progress) -> bytes:
    path = allowed_path(raw)
    try:
        size = path.stat().st_size
        _check_size(size)
        parts = []
        with path.open("rb") as handle:
            while block := handle.read(READ_BLOCK):
                parts.append(block)
                progress(sum(map(len, parts)), size, "reading file")
    except FileNotFoundError:
        raise NotFound("no such file") from None
    except PermissionError:
        raise PermissionDenied("this server may not read that file") from None
    except IsADirectoryError:
        raise InvalidInput("path is a directory") from None
    return b"".join(parts)


def fetch_url(raw: str, progress: Progress = no_progress) -> bytes:
    """GET the URL. Network trouble, 429 and 5xx are transient; redirects and other 4xx are final.

    The URL is checked again here (a task's stored arguments are not trusted) and fetched from
    the address the check resolved.
    """
    target = allowed_url(raw)
    timeout = DemoSettings.current().document_fetch_timeout_seconds
    try:
        with httpx2.Client(timeout=timeout) as client, closing(target.send(client, "GET", stream=True)) as response:
            _check_status(response)
            total = int(response.headers.get("content-length") or 0) or None
            if total:
                _check_size(total)
            parts, received = [], 0
            for block in response.iter_bytes(READ_BLOCK):
                received += len(block)
                _check_size(received)
                parts.append(block)
                progress(received, total, "downloading")
            return b"".join(parts)
    except httpx2.TransportError as exc:
        raise Transient(f"fetching the document failed: {type(exc).__name__}") from None


def _check_status(response: httpx2.Response) -> None:
    status = response.status_code
    if status == 429 or status >= 500:
        raise Transient(f"the document server answered {status}",
                        retry_after=retry_after_header(response.headers.get("retry-after")))
    if 300 <= status < 400:
        raise InvalidInput(f"the document server answered {status} (a redirect); give the final URL")
    if status in (401, 403):
        raise PermissionDenied(f"the document server answered {status}")
    if status in (404, 410):
        raise NotFound(f"the document server answered {status}")
    if status >= 400:
        raise InvalidInput(f"the document server answered {status}")


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
