"""The `idemops-client` command (also `python -m idemops_client`).

    idemops-client proxy --url https://idemops.example/mcp --token idm_...   # or IDEMOPS_TOKEN=idm_...
    idemops-client proxy --url https://idemops.example/mcp --oauth           # signs in in the browser (oauth.py)
    idemops-client demo --url ... --token ...

`proxy` is a stdio MCP server for MCP hosts (see proxy.py). Before serving it lists the
server's tools once (with --oauth, after signing in): a wrong URL, a refused token, a refused
sign-in, a token file others may read or an unusable ledger ends it at once with
a message on stderr (which hosts show in their MCP logs) and exit status 2, before any call.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import anyio
from mcp.client.auth import OAuthClientProvider

from idemops_client import oauth
from idemops_client.client import IdempotentClient
from idemops_client.errors import ClientError, ToolCallError
from idemops_client.ledger import Ledger
from idemops_client.oauth import DEFAULT_CALLBACK_PORT, SignInError, token_path
from idemops_client.retry import RetryPolicy

TOKEN_ENV = "IDEMOPS_TOKEN"
URL_ENV = "IDEMOPS_URL"


def default_ledger() -> Path:
    state = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    return state / "idemops-client" / "ledger.sqlite"


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="idemops-client", description="The agent's side of idemops.")
    commands = parser.add_subparsers(dest="command", required=True)
    proxy = commands.add_parser("proxy", help="a stdio MCP server for MCP hosts, forwarding to idemops safely")
    proxy.add_argument("--url", default=os.environ.get("IDEMOPS_URL"), help=f"the server's MCP URL (or {URL_ENV})")
    auth = proxy.add_mutually_exclusive_group()
    auth.add_argument("--token", default=None, help=f"a bearer token (or {TOKEN_ENV}, which keeps it out of ps)")
    auth.add_argument("--oauth", action="store_true",
                      help="sign in by OAuth in the browser (tokens kept in ~/.config/idemops-client/oauth/)")
    proxy.add_argument("--callback-port", type=int, default=DEFAULT_CALLBACK_PORT,
                       help="with --oauth: the port on 127.0.0.1 the sign-in's redirect comes back to")
    proxy.add_argument("--ledger", type=Path, default=None, help=f"the ledger file (default {default_ledger()})")
    proxy.add_argument("--session", default="proxy",
                       help="the session the keys are derived in (one per agent; kept across restarts)")
    proxy.add_argument("--max-seconds", type=float, default=45.0,
                       help="the retry budget of one call, within the host's own request timeout")
    proxy.add_argument("--max-attempts", type=int, default=8)
    commands.add_parser("demo", help="the scripted agent through a faulty network (python -m idemops_client.demo)",
                        add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["demo"]:
        from idemops_client import demo

        return demo.main(argv[1:])
    args = parser().parse_args(argv)
    token = None if args.oauth else args.token or os.environ.get("IDEMOPS_TOKEN")
    if not args.url:
        return fail(f"no server: give --url https://HOST/mcp (or set {URL_ENV})")
    if not token and not args.oauth:
        return fail(f"no token: give --token idm_... or set {TOKEN_ENV}, or sign in with --oauth")
    auth: OAuthClientProvider | None = None
    if args.oauth:
        try:
            auth = oauth.provider(args.url, callback_port=args.callback_port)
        except SignInError as error:
            return fail(str(error))
    policy = RetryPolicy(max_attempts=args.max_attempts, max_seconds=args.max_seconds,
                         attempt_timeout=min(30.0, args.max_seconds))
    try:
        ledger_path = args.ledger or default_ledger()
        ledger_path.parent.mkdir(parents=True, exist_ok=True)
        ledger = Ledger(ledger_path)
    except (ClientError, OSError) as error:
        return fail(str(error))
    return anyio.run(serve, args.url, token, ledger, args.session, policy, auth)


async def serve(url: str, token: str | None, ledger: Ledger, session: str, policy: RetryPolicy,
                auth: OAuthClientProvider | None = None) -> int:
    from idemops_client.proxy import Proxy

    if auth is not None:
        try:
            await oauth.sign_in(url, auth)
        except Exception as error:  # the SDK's OAuthFlowError, a refused registration, an HTTP failure...
            return fail(f"cannot sign in to {url} by OAuth: {error}")
    # The start-up check answers fast: a host waits for the proxy to come up.
    startup = RetryPolicy(max_attempts=2, max_seconds=15, attempt_timeout=10, base_delay=0.2)
    async with IdempotentClient(url, token, ledger=ledger, session_id=session, policy=startup, auth=auth) as client:
        try:
            tools = await client.tools()
        except ToolCallError as error:
            return fail(startup_message(url, error, oauth=auth is not None))
        if client.prepare_tool not in tools:
            print(f"idemops-client proxy: {url} offers no {client.prepare_tool}: a high-risk tool (one that takes "
                  "only ids the server issues) is refused with a message saying so.", file=sys.stderr)
        client.policy = policy
        print(f"idemops-client proxy: serving {len(tools)} tools of {url} on stdio "
              f"(session {session!r}, ledger {ledger.path})", file=sys.stderr, flush=True)
        await Proxy(client).serve_stdio()
    return 0


def startup_message(url: str, error: ToolCallError, *, oauth: bool = False) -> str:
    if error.error_class == "unauthorized" and oauth:
        return (f"the server at {url} refused the OAuth token ({error.message}): the connection was revoked? "
                f"Delete {token_path(url)} and start the proxy again to sign in again.")
    if error.error_class == "unauthorized":
        return (f"the server at {url} refused the token ({error.message}): it is wrong, expired or revoked. "
                "Issue a new one (manage.py issue_token) and restart the proxy with it.")
    if error.error_class in ("transport", "unavailable"):
        return f"cannot reach an idemops server at {url}: {error.message}. Check --url and that the server runs."
    return f"{url} does not answer as an MCP server ({error.error_class}: {error.message}). Check --url."


def fail(message: str) -> int:
    print(f"idemops-client: {message}", file=sys.stderr, flush=True)
    return 2


if __name__ == "__main__":
    sys.exit(main())
