"""A payment gateway: creates payments, honours Idempotency-Key, and can be told to misbehave.

    POST /payments            Idempotency-Key: <key>   {"amount", "currency", "payee", "reference"}
                              (X-Operation-Id: <id>, optional, is recorded with the payment)
                              201 created | 200 same key, same request (Idempotent-Replayed: true)
                              409 same key, other request | 422 invalid request
    GET  /payments?idempotency_key=<key>   200 | 404     (what reconcilers ask)
    GET  /payments?operation_id=<id>       200 | 404     (the caller's operation, as it named it)
    GET  /payments/<id>                    200 | 404
    POST /payments/<id>/callback           send the payment's callback again now (a late duplicate)
    POST /mandates            Idempotency-Key: <key>   {"customer", "iban"}
                              201 created | 200 same key, same request (Idempotent-Replayed: true)
                              409 same key, other request | 422 invalid request (or fault `reject`)
    GET  /mandates?idempotency_key=<key>   200 | 404
    GET  /mandates/<id>                    200 | 404
    POST /mandates/<id>/cancel             200 cancelled (again: the same answer, nothing changes) | 404
    PUT  /faults/<key or *>   {"mode": ..., "times": n?, "seconds": s?}  DELETE /faults/<key or *>
    GET  /healthz                          200 | 503 while its database is unreachable

The caller's operation id (X-Operation-Id), if sent, is recorded with the payment
it creates and shown as `operation_id`: the gateway's record names the operation as
the caller does. It plays no part in deduplication (the Idempotency-Key does that).

Every /payments request is noted in `requests_seen` with its W3C `traceparent` header, so a test
can follow a trace from idemops into the gateway (a real gateway would continue the trace).

While its database is unreachable every endpoint answers 503 with Retry-After;
it reconnects by itself when the database is back.

Faults, per request (header X-Fault) or per key (PUT /faults): `fail` (500,
nothing done), `reject` (422, nothing done), `ratelimit` (429, Retry-After), `unavailable` (503,
Retry-After), `unavailable-for-ages` (503 with an absurd Retry-After, nothing done), `hang`
(never answers, nothing done), `succeed-then-hang` (the
payment is committed, the response never arrives), `succeed-then-fail` (the payment is
committed, the answer is a 500), `succeed-then-reset` (the payment is committed, the
connection drops in the middle of the answer), `slow` (waits `seconds`, default 3, or until
the fault is deleted, then pays and answers as usual; a client that gave up meanwhile is paid
all the same),
`conflict` (409 as for a key already used with another request, nothing done).

Callbacks: with --callback-url (and the shared secret in PAYMENT_GATEWAY_CALLBACK_SECRET),
each new payment is also reported to that URL, as a real gateway's webhook would:

    POST <callback-url>   {"event": "payment.succeeded", "idempotency_key": ..., "payment": {...}}
    Gateway-Signature: t=<unix time>,v1=<hex HMAC-SHA256 of "<t>.<body>" under the secret>

A callback that is not answered 2xx is sent again after 0.5 s, 1 s, 2 s, … (honouring
Retry-After), up to CALLBACK_ATTEMPTS times; POST /payments/<id>/callback sends one again
on demand (what a gateway's late duplicate looks like).

Run: python -m downstream.payment_gateway --port 8001 --database-url postgresql:///payment_gateway?host=...
     [--callback-url http://127.0.0.1:8000/callbacks/payment-gateway]
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import os
import re
import secrets
import time
from decimal import Decimal, InvalidOperation
from typing import Any, TypedDict

import httpx2
import psycopg
from psycopg.rows import TupleRow
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from idemops_demo.downstream.common import (
    EXCEPTION_HANDLERS,
    RETRY_AFTER_SECONDS,
    arg_parser,
    healthz,
    service_lifespan,
)

SCHEMA = """
CREATE TABLE IF NOT EXISTS payments (
    id text PRIMARY KEY,
    idempotency_key text NOT NULL UNIQUE,
    request_digest text NOT NULL,
    amount numeric(14, 2) NOT NULL,
    currency text NOT NULL,
    payee text NOT NULL,
    reference text NOT NULL,
    status text NOT NULL DEFAULT 'succeeded',
    created_at timestamptz NOT NULL DEFAULT now()
);
ALTER TABLE payments ADD COLUMN IF NOT EXISTS operation_id text;
CREATE INDEX IF NOT EXISTS payments_operation_id ON payments (operation_id);
CREATE TABLE IF NOT EXISTS mandates (
    id text PRIMARY KEY,
    idempotency_key text NOT NULL UNIQUE,
    request_digest text NOT NULL,
    customer text NOT NULL,
    iban text NOT NULL,
    status text NOT NULL DEFAULT 'active',
    created_at timestamptz NOT NULL DEFAULT now(),
    cancelled_at timestamptz
);
CREATE TABLE IF NOT EXISTS faults (
    key text PRIMARY KEY,      -- an idempotency key, or * for every request
    mode text NOT NULL,
    remaining integer          -- null: until deleted
);
CREATE TABLE IF NOT EXISTS requests_seen (
    id serial PRIMARY KEY,
    method text NOT NULL,
    path text NOT NULL,
    idempotency_key text NOT NULL,
    traceparent text NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now()
);
ALTER TABLE faults ADD COLUMN IF NOT EXISTS seconds real;  -- how long `slow` waits
"""
FAULT_MODES = {"fail", "reject", "ratelimit", "unavailable", "unavailable-for-ages", "hang", "succeed-then-hang",
               "succeed-then-fail", "succeed-then-reset", "slow", "conflict"}
HANG_SECONDS = 3600
SLOW_SECONDS = 3.0
CALLBACK_ATTEMPTS = 8
CALLBACK_SECRET_VARIABLE = "PAYMENT_GATEWAY_CALLBACK_SECRET"
logger = logging.getLogger("payment_gateway")


# The columns every query reads, in payment_json's order.
COLUMNS = "id, idempotency_key, request_digest, amount, currency, payee, reference, status, created_at, operation_id"


class Payment(TypedDict):
    """A valid payment request."""

    amount: Decimal
    currency: str
    payee: str
    reference: str


def payment_json(row: TupleRow) -> dict[str, Any]:
    id_, key, _, amount, currency, payee, reference, status, created_at, operation_id = row
    return {"payment_id": id_, "status": status, "amount": f"{amount:.2f}", "currency": currency, "payee": payee,
            "reference": reference, "created_at": created_at.isoformat(), "operation_id": operation_id}


def validate(body: dict[str, Any]) -> tuple[Payment | None, str | None]:
    try:
        amount = Decimal(str(body["amount"]))
        exponent = amount.as_tuple().exponent  # a letter for NaN and Infinity
        if not isinstance(exponent, int) or amount <= 0 or exponent < -2:
            return None, "amount must be positive with at most 2 decimals"
        currency, payee, reference = str(body["currency"]), str(body["payee"]), str(body.get("reference", ""))
    except (KeyError, TypeError, InvalidOperation):
        return None, "amount, currency and payee are required"
    if len(currency) != 3 or not payee:
        return None, "currency must be a 3-letter code and payee non-empty"
    return {"amount": amount, "currency": currency, "payee": payee, "reference": reference}, None


async def take_fault(conn: psycopg.AsyncConnection[TupleRow], key: str) -> tuple[str | None, float | None]:
    """The fault armed for this key (else for every key) and its seconds, one use taken if it has a count."""
    row = await (await conn.execute(
        "WITH armed AS (SELECT key FROM faults WHERE key = ANY(%s) AND (remaining IS NULL OR remaining > 0) "
        "               ORDER BY key = '*' LIMIT 1 FOR UPDATE) "
        "UPDATE faults SET remaining = remaining - 1 FROM armed WHERE faults.key = armed.key "
        "RETURNING faults.mode, faults.seconds",
        [[key, "*"]])).fetchone()
    return (row[0], row[1]) if row else (None, None)


async def note_request(request: Request, key: str) -> None:
    async with request.app.state.db.connection() as conn:
        await conn.execute("INSERT INTO requests_seen (method, path, idempotency_key, traceparent) "
                           "VALUES (%s, %s, %s, %s)",
                           [request.method, request.url.path, key, request.headers.get("traceparent", "")])


async def create_payment(request: Request) -> Response:
    key = request.headers.get("idempotency-key", "")
    await note_request(request, key)
    parsed = await _parsed(request, key)
    if isinstance(parsed, Response):
        return parsed
    payment, operation_id = parsed
    fault, seconds = request.headers.get("x-fault"), None
    if not fault:
        async with request.app.state.db.connection() as conn:
            fault, seconds = await take_fault(conn, key)
    refused = await _fault_before_paying(request, key, fault, seconds)
    if refused is not None:
        return refused
    digest = hashlib.sha256(json.dumps({k: str(v) for k, v in payment.items()}, sort_keys=True).encode())
    if fault == "conflict":
        return _key_reused()
    async with request.app.state.db.connection() as conn:
        row, created = await insert_once(conn, key, digest.hexdigest(), payment, operation_id)
    if row[2] != digest.hexdigest():
        return _key_reused()
    if created:
        request.app.state.callbacks.report(key, payment_json(row))
    return await _paid_answer(fault, row, created)


async def _parsed(request: Request, key: str) -> tuple[Payment, str | None] | Response:
    """The payment asked for and its X-Operation-Id, or the 4xx answer that refuses the request."""
    if not key or len(key) > 200:
        return JSONResponse({"error": "Idempotency-Key header is required (at most 200 characters)"}, 400)
    operation_id = request.headers.get("x-operation-id") or None
    if operation_id is not None and len(operation_id) > 200:
        return JSONResponse({"error": "X-Operation-Id is at most 200 characters"}, 400)
    try:
        body = await request.json()
    except json.JSONDecodeError:
        return JSONResponse({"error": "body must be JSON"}, 400)
    payment, problem = validate(body if isinstance(body, dict) else {})
    if payment is None:
        return JSONResponse({"error": problem}, 422)
    return payment, operation_id


async def _fault_before_paying(request: Request, key: str, fault: str | None, seconds: float | None
                               ) -> Response | None:
    """An injected fault that strikes before the payment is made: its answer (None: go on, maybe slowly)."""
    if fault == "slow":
        await _slowly(request, key, SLOW_SECONDS if seconds is None else seconds)
    if fault == "fail":
        return JSONResponse({"error": "internal error (injected)"}, 500)
    if fault == "reject":
        return JSONResponse({"error": "payee account closed (injected)"}, 422)
    if fault in ("ratelimit", "unavailable"):
        return JSONResponse({"error": f"{fault} (injected)"}, 429 if fault == "ratelimit" else 503,
                            headers={"Retry-After": RETRY_AFTER_SECONDS})
    if fault == "unavailable-for-ages":  # a server that asks for an absurd wait
        return JSONResponse({"error": f"{fault} (injected)"}, 503, headers={"Retry-After": "99999999999999"})
    if fault == "hang":
        # Never answers and never pays, not even after the client gave up (and holds no connection).
        return await _never_answer()
    return None


async def _paid_answer(fault: str | None, row: TupleRow, created: bool) -> Response:
    """The answer once the payment is made (or found made): the payment, unless a fault strikes after it."""
    if fault == "succeed-then-hang":
        return await _never_answer()
    if fault == "succeed-then-fail":
        return JSONResponse({"error": "internal error after the payment was made (injected)"}, 500)
    if fault == "succeed-then-reset":
        return _ResetAnswer()
    return JSONResponse(payment_json(row), 201 if created else 200,
                        headers={} if created else {"Idempotent-Replayed": "true"})


class _ResetAnswer(Response):
    """Starts a 201 and drops the connection before its body is complete: the client sees the
    connection break mid-answer, after the payment committed."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 201,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", b"1000")]})
        await send({"type": "http.response.body", "body": b'{"payment_id": "pay_', "more_body": True})
        # Returning with the body unfinished makes the server close the connection.


async def _slowly(request: Request, key: str, seconds: float) -> None:
    """Wait `seconds`, or until the fault that slows this key is deleted (a test lets it go)."""
    deadline = time.monotonic() + seconds
    while (remaining := deadline - time.monotonic()) > 0:
        await asyncio.sleep(min(0.2, remaining))
        async with request.app.state.db.connection() as conn:
            armed = await (await conn.execute("SELECT 1 FROM faults WHERE key = ANY(%s) AND mode = 'slow'",
                                              [[key, "*"]])).fetchone()
        if armed is None:
            return


def _key_reused() -> Response:
    return JSONResponse({"error": "Idempotency-Key was already used with a different request"}, 409)


async def _never_answer() -> Response:
    await asyncio.sleep(HANG_SECONDS)
    return JSONResponse({"error": "gave up hanging"}, 504)


async def insert_once(conn: psycopg.AsyncConnection[TupleRow], key: str, digest: str, payment: Payment,
                      operation_id: str | None) -> tuple[TupleRow, bool]:
    """One payment per Idempotency-Key, guarded by the unique constraint."""
    row = await (await conn.execute(
        "INSERT INTO payments (id, idempotency_key, request_digest, amount, currency, payee, reference, operation_id) "
        f"VALUES (%s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (idempotency_key) DO NOTHING RETURNING {COLUMNS}",
        ["pay_" + secrets.token_hex(8), key, digest, payment["amount"], payment["currency"], payment["payee"],
         payment["reference"], operation_id])).fetchone()
    created = row is not None
    if not created:
        row = await (await conn.execute(f"SELECT {COLUMNS} FROM payments WHERE idempotency_key = %s",
                                        [key])).fetchone()
    await conn.commit()
    if row is None:  # the payment that took the key is gone (only a test's reset deletes payments)
        raise RuntimeError(f"the payment holding Idempotency-Key {key!r} disappeared")
    return row, created


async def find_payments(request: Request) -> Response:
    key = request.query_params.get("idempotency_key")
    await note_request(request, key or "")
    operation_id = request.query_params.get("operation_id")
    if key and not operation_id:
        return await _one(request, f"SELECT {COLUMNS} FROM payments WHERE idempotency_key = %s", key)
    if operation_id and not key:
        return await _one(request, f"SELECT {COLUMNS} FROM payments WHERE operation_id = %s ORDER BY created_at "
                                   "LIMIT 1", operation_id)
    return JSONResponse({"error": "give idempotency_key or operation_id"}, 400)


async def get_payment(request: Request) -> Response:
    return await _one(request, f"SELECT {COLUMNS} FROM payments WHERE id = %s", request.path_params["payment_id"])


async def _one(request: Request, sql: str, value: str) -> Response:
    async with request.app.state.db.connection() as conn:
        row = await (await conn.execute(sql, [value])).fetchone()
    if row is None:
        return JSONResponse({"error": "no such payment"}, 404)
    return JSONResponse(payment_json(row))


async def set_fault(request: Request) -> Response:
    body = await request.json()
    if body.get("mode") not in FAULT_MODES:
        return JSONResponse({"error": f"mode must be one of {sorted(FAULT_MODES)}"}, 422)
    async with request.app.state.db.connection() as conn:
        await conn.execute(
            "INSERT INTO faults (key, mode, remaining, seconds) VALUES (%s, %s, %s, %s) "
            "ON CONFLICT (key) DO UPDATE SET mode = excluded.mode, remaining = excluded.remaining, "
            "seconds = excluded.seconds",
            [request.path_params["key"], body["mode"], body.get("times"), body.get("seconds")])
    return JSONResponse({"key": request.path_params["key"], "mode": body["mode"], "times": body.get("times"),
                         "seconds": body.get("seconds")})


# --- callbacks ----------------------------------------------------------------------------------


def sign(secret: str, body: bytes, at: int | None = None) -> str:
    """The Gateway-Signature header of a callback body."""
    at = int(time.time()) if at is None else at
    mac = hmac.new(secret.encode(), f"{at}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={at},v1={mac}"


class Callbacks:
    """Reports payments to the callback URL, retrying until it answers 2xx (or gives up)."""

    def __init__(self, url: str | None, secret: str):
        self.url = url
        self.secret = secret
        self.pending: set[asyncio.Task[int | None]] = set()

    def report(self, key: str, payment: dict[str, Any]) -> None:
        if not self.url:
            return
        task = asyncio.get_running_loop().create_task(self.send(key, payment))
        self.pending.add(task)
        task.add_done_callback(self.pending.discard)

    async def send(self, key: str, payment: dict[str, Any], attempts: int = CALLBACK_ATTEMPTS) -> int | None:
        """POST the callback; the last status it got (None: no answer at all, or no callback URL)."""
        url = self.url
        if not url:
            return None
        body = json.dumps({"event": f"payment.{payment['status']}", "idempotency_key": key,
                           "payment": payment}).encode()
        status, pause = None, 0.5
        async with httpx2.AsyncClient(timeout=10) as client:
            for _ in range(attempts):
                try:
                    response = await client.post(url, content=body, headers={
                        "Content-Type": "application/json", "Gateway-Signature": sign(self.secret, body)})
                    status = response.status_code
                    if response.is_success:
                        return status
                    pause = float(response.headers.get("retry-after", pause))
                except httpx2.TransportError as exc:
                    logger.warning("callback for %s: %s", payment["payment_id"], type(exc).__name__)
                await asyncio.sleep(pause)
                pause = min(pause * 2, 30)
        return status


async def resend_callback(request: Request) -> Response:
    async with request.app.state.db.connection() as conn:
        row = await (await conn.execute("SELECT * FROM payments WHERE id = %s",
                                        [request.path_params["payment_id"]])).fetchone()
    if row is None:
        return JSONResponse({"error": "no such payment"}, 404)
    status = await request.app.state.callbacks.send(row[1], payment_json(row), attempts=1)
    return JSONResponse({"payment_id": row[0], "callback_status": status})


async def clear_fault(request: Request) -> Response:
    async with request.app.state.db.connection() as conn:
        await conn.execute("DELETE FROM faults WHERE key = %s", [request.path_params["key"]])
    return Response(status_code=204)


# --- mandates: a customer's permission to debit their account ---------------------------------


IBAN = re.compile(r"^[A-Z]{2}[0-9]{2}[A-Z0-9]{10,30}$")


def mandate_json(row: TupleRow) -> dict[str, Any]:
    id_, _, _, customer, iban, status, created_at, cancelled_at = row
    return {"mandate_id": id_, "status": status, "customer": customer, "iban_last4": iban[-4:],
            "created_at": created_at.isoformat(), "cancelled_at": cancelled_at.isoformat() if cancelled_at else None}


async def create_mandate(request: Request) -> Response:
    key = request.headers.get("idempotency-key", "")
    if not key or len(key) > 200:
        return JSONResponse({"error": "Idempotency-Key header is required (at most 200 characters)"}, 400)
    try:
        body = await request.json()
    except json.JSONDecodeError:
        return JSONResponse({"error": "body must be JSON"}, 400)
    customer, iban = str(body.get("customer", "")), str(body.get("iban", "")).replace(" ", "").upper()
    if not customer or not IBAN.match(iban):
        return JSONResponse({"error": "customer and a valid iban are required"}, 422)
    async with request.app.state.db.connection() as conn:
        fault = request.headers.get("x-fault") or (await take_fault(conn, key))[0]
    if fault == "reject":
        return JSONResponse({"error": "the bank refused the mandate (injected)"}, 422)
    if fault in ("ratelimit", "unavailable"):
        return JSONResponse({"error": f"{fault} (injected)"}, 429 if fault == "ratelimit" else 503,
                            headers={"Retry-After": RETRY_AFTER_SECONDS})
    if fault == "fail":
        return JSONResponse({"error": "internal error (injected)"}, 500)
    digest = hashlib.sha256(json.dumps([customer, iban]).encode()).hexdigest()
    async with request.app.state.db.connection() as conn:
        row = await (await conn.execute(
            "INSERT INTO mandates (id, idempotency_key, request_digest, customer, iban) VALUES (%s, %s, %s, %s, %s) "
            "ON CONFLICT (idempotency_key) DO NOTHING RETURNING *",
            ["man_" + secrets.token_hex(8), key, digest, customer, iban])).fetchone()
        created = row is not None
        if not created:
            row = await (await conn.execute("SELECT * FROM mandates WHERE idempotency_key = %s", [key])).fetchone()
        await conn.commit()
    if row[2] != digest:
        return _key_reused()
    return JSONResponse(mandate_json(row), 201 if created else 200,
                        headers={} if created else {"Idempotent-Replayed": "true"})


async def find_mandates(request: Request) -> Response:
    key = request.query_params.get("idempotency_key")
    if not key:
        return JSONResponse({"error": "idempotency_key is required"}, 400)
    return await _one_mandate(request, "SELECT * FROM mandates WHERE idempotency_key = %s", key)


async def get_mandate(request: Request) -> Response:
    return await _one_mandate(request, "SELECT * FROM mandates WHERE id = %s", request.path_params["mandate_id"])


async def _one_mandate(request: Request, sql: str, value: str) -> Response:
    async with request.app.state.db.connection() as conn:
        row = await (await conn.execute(sql, [value])).fetchone()
    if row is None:
        return JSONResponse({"error": "no such mandate"}, 404)
    return JSONResponse(mandate_json(row))


async def cancel_mandate(request: Request) -> Response:
    """Cancelling is idempotent: a cancelled mandate stays cancelled, at its first cancellation time."""
    async with request.app.state.db.connection() as conn:
        row = await (await conn.execute(
            "UPDATE mandates SET status = 'cancelled', cancelled_at = coalesce(cancelled_at, now()) "
            "WHERE id = %s RETURNING *", [request.path_params["mandate_id"]])).fetchone()
        await conn.commit()
    if row is None:
        return JSONResponse({"error": "no such mandate"}, 404)
    return JSONResponse(mandate_json(row))


def build_app(database_url: str, callback_url: str | None = None) -> Starlette:
    app = Starlette(
        routes=[
            Route("/payments", create_payment, methods=["POST"]),
            Route("/payments", find_payments, methods=["GET"]),
            Route("/payments/{payment_id}", get_payment, methods=["GET"]),
            Route("/payments/{payment_id}/callback", resend_callback, methods=["POST"]),
            Route("/mandates", create_mandate, methods=["POST"]),
            Route("/mandates", find_mandates, methods=["GET"]),
            Route("/mandates/{mandate_id}", get_mandate, methods=["GET"]),
            Route("/mandates/{mandate_id}/cancel", cancel_mandate, methods=["POST"]),
            Route("/faults/{key}", set_fault, methods=["PUT"]),
            Route("/faults/{key}", clear_fault, methods=["DELETE"]),
            Route("/healthz", healthz, methods=["GET"]),
        ],
        lifespan=service_lifespan(database_url, SCHEMA),
        exception_handlers=EXCEPTION_HANDLERS,
    )
    app.state.callbacks = Callbacks(callback_url, os.environ.get(CALLBACK_SECRET_VARIABLE, ""))
    return app


if __name__ == "__main__":
    import uvicorn

    parser = arg_parser("Run the payment gateway.", 8001, "payment_gateway")
    parser.add_argument("--callback-url", help=f"where payments are reported (secret: ${CALLBACK_SECRET_VARIABLE})")
    args = parser.parse_args()
    if args.callback_url and not os.environ.get(CALLBACK_SECRET_VARIABLE):
        parser.error(f"--callback-url needs the shared secret in ${CALLBACK_SECRET_VARIABLE}")
    uvicorn.run(build_app(args.database_url, args.callback_url), host=args.host, port=args.port,
                log_level="warning")
