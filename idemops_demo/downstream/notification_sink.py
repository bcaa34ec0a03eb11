"""A notification sink: an SMTP server and a webhook receiver that deduplicate by event id.

Both kinds of delivery land in one table keyed by the event id (the email's
Message-ID, or the webhook's X-Event-Id header): a redelivered event is
counted, not stored again, so "the effect happens once" is checkable. The first delivery's
W3C `traceparent` (an email header, an HTTP header) is kept with the message.

    SMTP on --smtp-port                      (Message-ID: <event-id@...>)
    POST /webhooks/<name>                    webhook-id (or X-Event-Id): <event-id>   any JSON body
    PUT  /secrets/webhooks/<name>  {"secret": "whsec_..."}   from now on a webhook to <name> must be
                                 signed with it (Standard Webhooks, checked by the `standardwebhooks`
                                 library): a missing or forged signature is refused (401, not stored)
    GET  /messages[?event_id=...]            what arrived, with a delivery count
    PUT  /faults  {"delay_seconds": s, "fail_times": n}   slow or refuse the next deliveries
    PUT  /faults/webhooks/<name>  {"mode": "hang" | "fail", "seconds": s?}   a poisoned recipient:
                                 every webhook to it hangs (`seconds`, default an hour) or fails (503)
    GET  /attempts               every webhook request received: (event_id, name, outcome: ...,
                                 forged for a refused signature)
    GET  /healthz                            200 | 503 while its database is unreachable
    any other request                        404, and recorded in stray_requests (method, raw path)

Run: python -m downstream.notification_sink --port 8002 --smtp-port 8025 --database-url ...
"""

from __future__ import annotations

import asyncio
import json
from email import message_from_bytes
from email.policy import default as default_policy

import psycopg
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, Envelope, Session
from standardwebhooks import Webhook, WebhookVerificationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from idemops_demo.downstream.common import EXCEPTION_HANDLERS, arg_parser, ensure_database, healthz, service_lifespan

SCHEMA = """
CREATE TABLE IF NOT EXISTS messages (
    event_id text PRIMARY KEY,
    channel text NOT NULL,
    recipient text NOT NULL,
    subject text NOT NULL,
    body text NOT NULL,
    deliveries integer NOT NULL DEFAULT 1,
    first_received_at timestamptz NOT NULL DEFAULT now(),
    last_received_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS faults (
    id integer PRIMARY KEY DEFAULT 1 CHECK (id = 1),
    delay_seconds real NOT NULL DEFAULT 0,
    fail_times integer NOT NULL DEFAULT 0
);
INSERT INTO faults (id) VALUES (1) ON CONFLICT DO NOTHING;
ALTER TABLE messages ADD COLUMN IF NOT EXISTS traceparent text NOT NULL DEFAULT '';
CREATE TABLE IF NOT EXISTS webhook_faults (
    name text PRIMARY KEY,
    mode text NOT NULL,
    seconds real
);
CREATE TABLE IF NOT EXISTS webhook_attempts (
    id serial PRIMARY KEY,
    event_id text NOT NULL,
    name text NOT NULL,
    outcome text NOT NULL,   -- received (still being answered), stored, failed, hung
    received_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS webhook_secrets (
    name text PRIMARY KEY,
    secret text NOT NULL
);
ALTER TABLE messages ADD COLUMN IF NOT EXISTS signature text NOT NULL DEFAULT 'unchecked';  -- or verified
CREATE TABLE IF NOT EXISTS stray_requests (
    id serial PRIMARY KEY,
    method text NOT NULL,
    path text NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now()
);
"""
STORE = """
INSERT INTO messages (event_id, channel, recipient, subject, body, traceparent, signature)
VALUES (%s, %s, %s, %s, %s, %s, %s)
ON CONFLICT (event_id) DO UPDATE SET deliveries = messages.deliveries + 1, last_received_at = now()
"""
# Used up one delivery at a time, so a test can fail or slow exactly the next n.
HANG_SECONDS = 3600
TAKE_FAULT = """
UPDATE faults SET fail_times = greatest(fail_times - 1, 0) WHERE id = 1
RETURNING delay_seconds, (SELECT fail_times FROM faults WHERE id = 1) > 0
"""


class SmtpHandler:
    def __init__(self, database_url: str):
        self.database_url = database_url

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        # The DATA as received (`content` is the same bytes: the controller decodes nothing).
        message = message_from_bytes(envelope.original_content or b"", policy=default_policy)
        event_id = (message.get("Message-ID") or "").strip("<>").split("@")[0]
        if not event_id:
            return "550 Message-ID required: it is the event id we deduplicate by"
        try:
            # A connection per message: nothing to go stale across a database restart.
            with psycopg.connect(self.database_url, autocommit=True, connect_timeout=2) as conn:
                row = conn.execute(TAKE_FAULT).fetchone()
                delay, fail = row if row is not None else (0.0, False)  # no faults row: nothing armed
                await asyncio.sleep(delay)
                if fail:
                    return "451 temporary failure (injected)"
                body = message.get_body(("plain",))
                conn.execute(STORE, [event_id, "email", ", ".join(envelope.rcpt_tos), message.get("Subject", ""),
                                     body.get_content() if body else "", message.get("traceparent", ""),
                                     "unchecked"])
        except psycopg.OperationalError:
            return "451 database unavailable, try again later"
        return "250 OK"


async def receive_webhook(request: Request) -> Response:
    event_id = request.headers.get("webhook-id") or request.headers.get("x-event-id")
    if not event_id:
        return JSONResponse({"error": "a webhook-id (or X-Event-Id) header is required"}, 400)
    raw = await request.body()  # verified as received: the signature covers these bytes
    name = request.path_params["name"]
    async with request.app.state.db.connection() as conn:
        attempt = (await (await conn.execute(
            "INSERT INTO webhook_attempts (event_id, name, outcome) VALUES (%s, %s, 'received') RETURNING id",
            [event_id, name])).fetchone())[0]
        secret = await (await conn.execute("SELECT secret FROM webhook_secrets WHERE name = %s",
                                           [name])).fetchone()
        if secret is not None:
            try:
                Webhook(secret[0]).verify(raw, dict(request.headers), json_parse=False)
            except (WebhookVerificationError, ValueError) as exc:  # ValueError: a malformed header
                await conn.execute("UPDATE webhook_attempts SET outcome = 'forged' WHERE id = %s", [attempt])
                return JSONResponse({"error": f"signature refused: {exc}"}, 401)
        await conn.commit()
    payload = json.loads(raw)
    signature = "unchecked" if secret is None else "verified"
    async with request.app.state.db.connection() as conn:
        poison = await (await conn.execute("SELECT mode, seconds FROM webhook_faults WHERE name = %s",
                                           [name])).fetchone()
        delay, fail = await (await conn.execute(TAKE_FAULT)).fetchone()
        await conn.commit()
    if poison is not None:
        mode, seconds = poison
        if mode == "hang":
            await asyncio.sleep(HANG_SECONDS if seconds is None else seconds)
        await _note(request, attempt, "hung" if mode == "hang" else "failed")
        return JSONResponse({"error": f"poisoned recipient ({mode}, injected)"}, 503)
    await asyncio.sleep(delay)
    if fail:
        await _note(request, attempt, "failed")
        return JSONResponse({"error": "temporary failure (injected)"}, 503)
    async with request.app.state.db.connection() as conn:
        await conn.execute(STORE, [event_id, "webhook", name, str(payload.get("subject", "")), json.dumps(payload),
                                   request.headers.get("traceparent", ""), signature])
        await conn.execute("UPDATE webhook_attempts SET outcome = 'stored' WHERE id = %s", [attempt])
    return JSONResponse({"event_id": event_id}, 202)


async def _note(request: Request, attempt: int, outcome: str) -> None:
    async with request.app.state.db.connection() as conn:
        await conn.execute("UPDATE webhook_attempts SET outcome = %s WHERE id = %s", [outcome, attempt])


async def set_webhook_secret(request: Request) -> Response:
    secret = (await request.json()).get("secret")
    try:
        Webhook(secret)
    except Exception:
        return JSONResponse({"error": "secret must be a Standard Webhooks secret (whsec_ and base64)"}, 422)
    async with request.app.state.db.connection() as conn:
        await conn.execute("INSERT INTO webhook_secrets (name, secret) VALUES (%s, %s) "
                           "ON CONFLICT (name) DO UPDATE SET secret = excluded.secret",
                           [request.path_params["name"], secret])
    return JSONResponse({"name": request.path_params["name"]})


async def poison_webhook(request: Request) -> Response:
    body = await request.json()
    if body.get("mode") not in ("hang", "fail"):
        return JSONResponse({"error": "mode must be hang or fail"}, 422)
    async with request.app.state.db.connection() as conn:
        await conn.execute("INSERT INTO webhook_faults (name, mode, seconds) VALUES (%s, %s, %s) "
                           "ON CONFLICT (name) DO UPDATE SET mode = excluded.mode, seconds = excluded.seconds",
                           [request.path_params["name"], body["mode"], body.get("seconds")])
    return JSONResponse(body)


async def list_attempts(request: Request) -> Response:
    async with request.app.state.db.connection() as conn:
        rows = await (await conn.execute("SELECT event_id, name, outcome FROM webhook_attempts ORDER BY id")).fetchall()
    return JSONResponse({"attempts": [list(row) for row in rows]})


async def list_messages(request: Request) -> Response:
    event_id = request.query_params.get("event_id")
    async with request.app.state.db.connection() as conn:
        cursor = await conn.execute(
            "SELECT event_id, channel, recipient, subject, body, deliveries FROM messages "
            "WHERE %s::text IS NULL OR event_id = %s ORDER BY first_received_at", [event_id, event_id])
        rows = await cursor.fetchall()
    keys = ["event_id", "channel", "recipient", "subject", "body", "deliveries"]
    return JSONResponse({"messages": [dict(zip(keys, row, strict=True)) for row in rows]})


async def set_faults(request: Request) -> Response:
    body = await request.json()
    async with request.app.state.db.connection() as conn:
        await conn.execute("UPDATE faults SET delay_seconds = %s, fail_times = %s WHERE id = 1",
                           [float(body.get("delay_seconds", 0)), int(body.get("fail_times", 0))])
    return JSONResponse(body)


async def stray(request: Request) -> Response:
    """A request to no route: kept, so a test can show nothing was sent where it must not go."""
    path = request.scope.get("raw_path", b"").decode("latin-1") or request.url.path
    async with request.app.state.db.connection() as conn:
        await conn.execute("INSERT INTO stray_requests (method, path) VALUES (%s, %s)", [request.method, path])
    return JSONResponse({"error": "not found"}, 404)


def build_app(database_url: str) -> Starlette:
    return Starlette(
        routes=[
            Route("/webhooks/{name}", receive_webhook, methods=["POST"]),
            Route("/messages", list_messages, methods=["GET"]),
            Route("/faults", set_faults, methods=["PUT"]),
            Route("/faults/webhooks/{name}", poison_webhook, methods=["PUT"]),
            Route("/secrets/webhooks/{name}", set_webhook_secret, methods=["PUT"]),
            Route("/attempts", list_attempts, methods=["GET"]),
            Route("/healthz", healthz, methods=["GET"]),
            Route("/{path:path}", stray, methods=["GET", "POST", "PUT", "PATCH", "DELETE"]),
        ],
        lifespan=service_lifespan(database_url, SCHEMA),
        exception_handlers=EXCEPTION_HANDLERS,
    )


def main() -> None:
    import uvicorn

    parser = arg_parser("Run the notification sink.", 8002, "notification_sink")
    parser.add_argument("--smtp-port", type=int, default=8025)
    args = parser.parse_args()
    ensure_database(args.database_url)
    with psycopg.connect(args.database_url, autocommit=True) as conn:
        conn.execute(SCHEMA)
    controller = Controller(SmtpHandler(args.database_url), hostname=args.host, port=args.smtp_port)
    controller.start()
    try:
        uvicorn.run(build_app(args.database_url), host=args.host, port=args.port, log_level="warning")
    finally:
        controller.stop()


if __name__ == "__main__":
    main()
