"""Outbound URLs that callers name (webhook recipients, document URLs): one allow-list check.

A caller's URL is checked when the tool is called (a refusal is `invalid_input`
naming the field) and again right before the request goes out: the outbox
relay and the document fetcher trust no stored URL. The check and the request
see the same URL: it is parsed once, by the HTTP client's own parser (httpx2,
which also resolves dot segments), and the request is sent to that parsed URL.
A URL passes when:

- it is http(s), carries no userinfo (`http://allowed@evil/`), no whitespace,
  control characters or backslashes, and its host is a name or a canonical IP
  literal (not `2130706433`, `0x7f.1`, `127.1` or `0177.0.0.1`);
- its path encodes no `/`, `\\`, `.`, `%` or NUL (`%2e%2e/`, `..%2f`,
  `%252e`) and has no `..;` segments: servers decode those differently, so
  they are refused rather than normalised;
- its scheme, host, port and path (segment by segment) fall under an
  allow-list prefix;
- every address its host resolves to is public (IPv4-mapped and 6to4 forms
  are unwrapped first), unless the prefix names that IP address itself or the
  host is in IDEMOPS_OUTBOUND_PRIVATE_HOSTS.

`Target.send` then connects to the address that was checked (DNS is not
asked twice, so a rebinding answer cannot move the request), with the
original Host header and TLS server name, and never follows a redirect.
"""

from __future__ import annotations

import logging
import re
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv6Address, IPv6Network, ip_address
from typing import Any
from urllib.parse import unquote

import httpx2

from tools_app.conf import conf
from tools_app.core import tracing
from tools_app.core.errors import InvalidInput, Transient

logger = logging.getLogger(__name__)

Address = IPv4Address | IPv6Address
DEFAULT_PORTS = {"http": 80, "https": 443}
# Percent-escapes of characters that change what a path means to the server that decodes them.
_AMBIGUOUS_ESCAPE = re.compile(r"%(2f|5c|2e|25|00)", re.IGNORECASE)
# WHATWG URL parsing reads a host whose last label is a number as an IPv4 address (`127.1`, `0x7f.1`).
_NUMERIC_LABEL = re.compile(r"(0x[0-9a-f]*|[0-9]+)", re.IGNORECASE)
_NAT64 = IPv6Network("64:ff9b::/96")
RESOLVE_RETRY_AFTER = 5.0


@dataclass(frozen=True)
class Target:
    """A checked URL and the address it was checked at."""

    url: httpx2.URL
    address: Address

    def send(self, client: httpx2.Client, method: str, *, stream: bool = False,
             headers: dict[str, str] | None = None, **kwargs: Any) -> httpx2.Response:
        """Send a request to the checked address; redirects come back as they are, never followed."""
        host = self.url.raw_host.decode("ascii")
        extensions = {"sni_hostname": host} if self.url.scheme == "https" and _ip_literal(host) is None else {}
        request = client.build_request(
            method, self.url.copy_with(host=str(self.address)),
            headers={**(headers or {}), "Host": self.url.netloc.decode("ascii")}, extensions=extensions, **kwargs)
        return tracing.send(client, request, shown_url=str(self.url), stream=stream, follow_redirects=False)


def check(raw: str, prefixes: Iterable[str], *, field: str) -> Target:
    """The Target for `raw` if it passes the allow-list `prefixes`; InvalidInput naming `field` if not."""
    url = _parse(raw, field)
    path = _checked_path(url, field)
    entry = next((entry for entry in map(_entry, prefixes) if entry is not None and _matches(url, path, entry)),
                 None)
    if entry is None:
        raise InvalidInput(f"{field}: not under a URL prefix on this server's allow-list (compared after "
                           "resolving dot segments; scheme, host and port must match exactly)")
    host = _host(url)
    literal = _ip_literal(host)
    if literal is not None:
        # Only an entry naming this very address matches an IP literal: it is allowed explicitly.
        return Target(url, literal)
    addresses = _resolve(host, _port(url), field)
    if host not in _private_hosts_allowed() and not all(map(is_public, addresses)):
        raise InvalidInput(f"{field}: the host resolves to a private, loopback or link-local address, which this "
                           "server does not call (IDEMOPS_OUTBOUND_PRIVATE_HOSTS lists hosts that may)")
    return Target(url, addresses[0])


def is_public(address: Address) -> bool:
    if isinstance(address, IPv6Address):
        # An IPv4 address wrapped in IPv6 (::ffff:127.0.0.1, 6to4, NAT64) is judged as itself.
        if address in _NAT64:
            address = IPv4Address(int(address) & 0xFFFFFFFF)
        else:
            address = address.ipv4_mapped or address.sixtofour or address
    return address.is_global and not address.is_multicast


def resolve(host: str, port: int) -> list[Address]:
    """The host's addresses from the system resolver (the seam tests use to play DNS)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    # An IPv6 link-local answer carries its zone (fe80::1%eth0).
    return list(dict.fromkeys(ip_address(str(info[4][0]).split("%")[0]) for info in infos))


# --- parsing ---------------------------------------------------------------------------------


def _parse(raw: str, field: str) -> httpx2.URL:
    if any(char.isspace() or ord(char) < 0x20 or char in "\x7f\\" for char in raw):
        raise InvalidInput(f"{field}: a URL must not contain whitespace, control characters or backslashes")
    try:
        url = httpx2.URL(raw)
    except (httpx2.InvalidURL, UnicodeError, ValueError):
        raise InvalidInput(f"{field}: not a valid URL") from None
    if url.scheme not in DEFAULT_PORTS or not url.raw_host:
        raise InvalidInput(f"{field}: must be an http or https URL")
    if url.userinfo:
        raise InvalidInput(f"{field}: a URL must not carry a user name or password")
    host = _host(url)
    if _ip_literal(host) is None and _NUMERIC_LABEL.fullmatch(host.rsplit(".", 1)[-1]):
        raise InvalidInput(f"{field}: write an IP address as a.b.c.d, or [IPv6] in brackets")
    return url


def _checked_path(url: httpx2.URL, field: str) -> str:
    raw_path = url.raw_path.split(b"?", 1)[0].decode("ascii")
    if _AMBIGUOUS_ESCAPE.search(raw_path):
        raise InvalidInput(f"{field}: the path must not percent-encode '/', '\\', '.', '%' or NUL")
    path = unquote(raw_path)
    if any(ord(char) < 0x20 or char == "\x7f" for char in path):
        raise InvalidInput(f"{field}: the path must not contain control characters")
    if any(segment.split(";", 1)[0] in (".", "..") for segment in path.split("/")):
        raise InvalidInput(f"{field}: the path must not contain dot segments")
    return path or "/"


@dataclass(frozen=True)
class _Entry:
    url: httpx2.URL
    path: str


def _entry(prefix: str) -> _Entry | None:
    try:
        url = _parse(prefix, "allow-list entry")
        return _Entry(url, _checked_path(url, "allow-list entry"))
    except InvalidInput as exc:
        logger.warning("ignoring URL allow-list entry %r: %s", prefix, exc.message)
        return None


def _matches(url: httpx2.URL, path: str, entry: _Entry) -> bool:
    return (url.scheme == entry.url.scheme and _same_host(_host(url), _host(entry.url))
            and _port(url) == _port(entry.url) and _under(path, entry.path))


def _under(path: str, prefix: str) -> bool:
    """Segment-wise: /docs covers /docs and /docs/a, not /docs-private."""
    if prefix.endswith("/"):
        return path.startswith(prefix)
    return path == prefix or path.startswith(prefix + "/")


def _host(url: httpx2.URL) -> str:
    return url.raw_host.decode("ascii").lower().rstrip(".")


def _same_host(a: str, b: str) -> bool:
    a_ip, b_ip = _ip_literal(a), _ip_literal(b)
    if a_ip is not None or b_ip is not None:
        return a_ip == b_ip
    return a == b


def _ip_literal(host: str) -> Address | None:
    try:
        return ip_address(host.strip("[]"))
    except ValueError:
        return None


def _port(url: httpx2.URL) -> int:
    return url.port or DEFAULT_PORTS[url.scheme]


def _private_hosts_allowed() -> set[str]:
    return {host.lower().rstrip(".") for host in conf().outbound_private_hosts}


def _resolve(host: str, port: int, field: str) -> list[Address]:
    try:
        addresses = resolve(host, port)
    except socket.gaierror as exc:
        if exc.errno in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)):
            raise InvalidInput(f"{field}: the host does not resolve") from None
        raise Transient(f"{field}: the host could not be resolved now ({exc.strerror})",
                        retry_after=RESOLVE_RETRY_AFTER) from None
    if not addresses:
        raise InvalidInput(f"{field}: the host does not resolve")
    return addresses
