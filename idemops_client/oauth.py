"""Signing the proxy in by OAuth 2.1: the mcp SDK's client (`mcp.client.auth`), a local browser step, and
the tokens kept in the user's config directory.

    idemops-client proxy --url https://idemops.example/mcp --oauth

The SDK's OAuthClientProvider does the protocol: it finds the authorization server from /mcp's 401,
registers the proxy (dynamic client registration), sends the person to the consent page with a PKCE
challenge, exchanges the code, and refreshes the access token when it expires. This module gives it
what is the proxy's own:

- the browser step: the authorization URL is opened in the person's browser (Python's `webbrowser`,
  which honours $BROWSER) and written to stderr, which hosts show in their MCP logs; the consent page
  redirects to a listener on 127.0.0.1 (`--callback-port`), opened only while a sign-in waits for it;
- the storage: one file per server URL under $XDG_CONFIG_HOME/idemops-client/oauth/ (default
  ~/.config), holding the registration and the tokens. A refresh token signs in as the person who
  consented, so the file is created 0600 in a 0700 directory, and a file that others may read or
  write (or that another user owns) is refused, naming the chmod that fixes it, rather than used.

The callback port is fixed (not chosen at random) because the registration names the redirect URI:
the same port every run keeps the stored registration, and with it the refresh token, usable.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import sys
import threading
import webbrowser
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import anyio
import anyio.abc
import httpx2
from mcp import Client
from mcp.client.auth import OAuthClientProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import AuthorizationCodeResult, OAuthClientInformationFull, OAuthClientMetadata, OAuthToken

from idemops_client.errors import ClientError

DEFAULT_CALLBACK_PORT = 33418
CALLBACK_PATH = "/callback"
SIGN_IN_SECONDS = 600.0  # how long the browser step may take a person (login, authenticator code, consent)
CLIENT_NAME = "idemops-client proxy"


class SignInError(ClientError):
    """The OAuth sign-in could not be done, or its stored tokens cannot be trusted; the message says why."""


def config_dir() -> Path:
    return Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "idemops-client"


def token_path(url: str) -> Path:
    """The file of one server's sign-in (its name a digest of the URL: the URL may carry a port, a path)."""
    return config_dir() / "oauth" / f"{hashlib.sha256(url.encode()).hexdigest()[:24]}.json"


class TokenFile:
    """The SDK's TokenStorage in one JSON file that only its owner may read or write."""

    def __init__(self, path: Path, url: str):
        self.path = path
        self.url = url

    def check(self) -> None:
        """Refuse a file, or directory, that another user could read or change (a stolen refresh token
        signs in as the person who consented; a planted one signs the proxy in as someone else)."""
        for place, allowed in ((self.path.parent, 0o700), (self.path, 0o600)):
            try:
                found = place.stat()
            except FileNotFoundError:
                continue
            mode = stat.S_IMODE(found.st_mode)
            if found.st_uid != os.getuid():
                raise SignInError(f"{place} belongs to another user (uid {found.st_uid}); it holds OAuth tokens: "
                                  f"delete it to sign in again")
            if mode & ~allowed:
                raise SignInError(f"{place} is open to other users (mode {mode:o}); it holds OAuth tokens: "
                                  f"chmod {allowed:o} {place} (or delete it to sign in again)")

    def _read(self) -> dict[str, Any]:
        self.check()
        try:
            saved = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as error:
            raise SignInError(f"{self.path}: cannot read the stored sign-in ({error}); delete it to sign in again"
                              ) from error
        return saved if isinstance(saved, dict) and saved.get("server") == self.url else {}

    def _write(self, **changed: Any) -> None:
        saved = {**self._read(), "server": self.url, **changed}
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.path.parent.chmod(0o700)
        partial = self.path.with_suffix(".partial")
        # Created 0600 before anything is written into it, and swapped in whole: a crash mid-write leaves
        # the previous tokens, never half a file.
        descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as out:
            json.dump(saved, out)
        os.replace(partial, self.path)

    async def get_tokens(self) -> OAuthToken | None:
        tokens = self._read().get("tokens")
        return OAuthToken.model_validate(tokens) if tokens else None

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self._write(tokens=tokens.model_dump(mode="json", exclude_none=True))

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        client = self._read().get("client")
        return OAuthClientInformationFull.model_validate(client) if client else None

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self._write(client=client_info.model_dump(mode="json", exclude_none=True))


class BrowserStep:
    """The person's part: the authorization URL opened in a browser, and the redirect taken on 127.0.0.1."""

    def __init__(self, port: int):
        self.port = port
        self.redirect_uri = f"http://127.0.0.1:{port}{CALLBACK_PATH}"
        self._listener: anyio.abc.Listener[anyio.abc.SocketStream] | None = None
        self._redirected: tuple[anyio.Event, dict[str, list[str]]] | None = None

    async def open(self, authorization_url: str) -> None:
        """The SDK's redirect_handler: listen first (the browser may be quick), then send the person."""
        try:
            self._listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=self.port)
        except OSError as error:
            raise SignInError(f"cannot listen on 127.0.0.1:{self.port} for the sign-in's redirect ({error}): "
                              "another proxy signing in? Give another --callback-port") from error
        self._redirected = (anyio.Event(), {})
        print(f"idemops-client proxy: sign in to idemops in your browser: {authorization_url}",
              file=sys.stderr, flush=True)
        # Not awaited: a browser command may run until the person is done (webbrowser waits for a generic
        # $BROWSER), and the redirect it brings back is answered only once callback() serves the listener.
        threading.Thread(target=_open_browser, args=(authorization_url,), daemon=True).start()

    async def callback(self) -> AuthorizationCodeResult:
        """The SDK's callback_handler: the code and state of the consent page's redirect."""
        if self._listener is None or self._redirected is None:
            raise SignInError("the sign-in was not started")
        done, query = self._redirected
        listener = self._listener
        try:
            async with anyio.create_task_group() as group:
                group.start_soon(listener.serve, self._answer)
                with anyio.fail_after(SIGN_IN_SECONDS):
                    await done.wait()
                group.cancel_scope.cancel()
        except TimeoutError as error:
            raise SignInError(f"no sign-in within {SIGN_IN_SECONDS:.0f} s") from error
        finally:
            await listener.aclose()
            self._listener = None
        if "error" in query:
            raise SignInError(f"the sign-in was refused: {query['error'][0]} "
                              f"{query.get('error_description', [''])[0]}".strip())
        if "code" not in query:
            raise SignInError("the sign-in's redirect carried no code")
        return AuthorizationCodeResult(code=query["code"][0], state=query.get("state", [None])[0],
                                       iss=query.get("iss", [None])[0])

    async def _answer(self, stream: anyio.abc.SocketStream) -> None:
        assert self._redirected is not None
        done, query = self._redirected
        async with stream:
            request = b""
            with anyio.move_on_after(30):
                while b"\r\n\r\n" not in request and len(request) < 65536:
                    request += await stream.receive()
            target = request.split(b" ", 2)[1].decode("latin-1") if request.count(b" ") >= 2 else ""
            parts = urlsplit(target)
            if parts.path != CALLBACK_PATH or done.is_set():
                await stream.send(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                return
            query.update(parse_qs(parts.query))
            words = ("Signed in: the idemops proxy has its token. You may close this window." if "code" in query
                     else "The sign-in was not completed; the proxy says why in its log.")
            body = f"<!doctype html><title>idemops-client</title><p>{words}</p>".encode()
            await stream.send(b"HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\n"
                              + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
            done.set()


def _open_browser(url: str) -> None:
    try:
        webbrowser.open(url)
    except webbrowser.Error:
        pass  # no browser here: the URL is on stderr, to open elsewhere


def provider(url: str, *, callback_port: int = DEFAULT_CALLBACK_PORT) -> OAuthClientProvider:
    """An httpx auth that signs the proxy in (and refreshes its token) with the stored tokens of `url`."""
    storage = TokenFile(token_path(url), url)
    storage.check()  # before anything is sent: a file others can read is refused at start, not mid-call
    browser = BrowserStep(callback_port)
    # The model types redirect_uris as AnyUrl and validates a str into one; mypy sees only the annotation.
    metadata = OAuthClientMetadata(client_name=CLIENT_NAME, redirect_uris=[browser.redirect_uri],  # type: ignore[list-item]
                                   grant_types=["authorization_code", "refresh_token"], response_types=["code"],
                                   token_endpoint_auth_method="none")
    return OAuthClientProvider(server_url=url, client_metadata=metadata, storage=storage,
                               redirect_handler=browser.open, callback_handler=browser.callback)


async def sign_in(url: str, auth: OAuthClientProvider) -> None:
    """Signed in before serving: a tools/list through the provider, which asks the person only when the
    stored tokens are missing or refused (a refresh first). Outside the proxy's retry budget, which is
    seconds; a person takes minutes."""
    async with httpx2.AsyncClient(auth=auth, timeout=httpx2.Timeout(30, connect=10)) as http:
        async with Client(streamable_http_client(url, http_client=http), mode="legacy",
                          read_timeout_seconds=SIGN_IN_SECONDS + 60) as client:
            await client.list_tools()
