"""A payment gateway: creates payments, honours Idempotency-Key, and can be told to misbehave.

    POST /payments            Idempotency-Key: <key>   {"amount", "currency", "payee", "reference"}
                              (X-Operation-Id: <id>, optional, is recorded with the payment)
                              201 created | 200 same key, same request (Idempotent-Replayed: true)
                              409 same key, other request | 422 invalid request
    GET  /payments?idempotency_key=<key>   200 | 404     (what reconcilers ask)
    GET  /payments?operation_id=<id>       200 | 404     (the caller's operation, as it named it)
    GET  /payments/<id>                    200 | 404
    PUT  /faults/<key or *>   {"mode": ..., "times": n?}  DELETE /faults/<key or *>
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
payment is committed, the response never arrives), `conflict` (409 as for a key
already used with another request, nothing done).

Run: python -m downstream.payment_gateway --port 8001 --database-url postgresql:///payment_gateway?host=...
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import secrets
from decimal import Decimal, InvalidOperation

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from downstream.common import EXCEPTION_HANDLERS, RETRY_AFTER_SECONDS, arg_parser, healthz, service_lifespan

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
"""
FAULT_MODES = {"fail", "reject", "ratelimit", "unavailable", "unavailable-for-ages", "hang", "succeed-then-hang",
               "conflict"}
HANG_SECONDS = 3600


# The columns every query reads, in payment_json's order.
COLUMNS = "id, idempotency_key, request_digest, amount, currency, payee, reference, status, created_at, operation_id"


def payment_json(row) -> dict:
    id_, key, _, amount, currency, payee, reference, status, created_at, operation_id = row
    return {"payment_id": id_, "status": status, "amount": f"{amount:.2f}", "currency": currency, "payee": payee,
            "reference": reference, "created_at": created_at.isoformat(), "operation_id": operation_id}


def validate(body: dict) -> tuple[dict | None, str | None]:
    try:
        amount = Decimal(str(body["amount"]))
        if amount <= 0 or amount.as_tuple().exponent < -2:
            return None, "amount must be positive with at most 2 decimals"
        currency, payee, reference = str(body["currency"]), str(body["payee"]), str(body.get("reference", ""))
    except (KeyError, TypeError, InvalidOperation):
        return None, "amount, currency and payee are required"
    if len(currency) != 3 or not payee:
        return None, "currency must be a 3-letter code and payee non-empty"
    return {"amount": amount, "currency": currency, "payee": payee, "reference": reference}, None


async def take_fault(conn, key: str) -> str | None:
    """The fault armed for this key (else for every key), one use taken if it has a count."""
    row = await (await conn.execute(
        "WITH armed AS (SELECT key FROM faults WHERE key = ANY(%s) AND (remaining IS NULL OR remaining > 0) "
        "               ORDER BY key = '*' LIMIT 1 FOR UPDATE) "
        "UPDATE faults SET remaining = remaining - 1 FROM armed WHERE faults.key = armed.key RETURNING faults.mode",
        [[key, "*"]])).fetchone()
    return row[0] if row else None


async def note_request(request: Request, key: str) -> None:
    async with request.app.state.db.connection() as conn:
        await conn.execute("INSERT INTO requests_seen (method, path, idempotency_key, traceparent) "
                           "VALUES (%s, %s, %s, %s)",
                           [request.method, request.url.path, key, request.headers.get("traceparent", "")])


async def create_payment(request: Request) -> Response:
    key = request.headers.get("idempotency-key", "")
    await note_request(request, key)
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
    if problem:
        return JSONResponse({"error": problem}, 422)
    async with request.app.state.db.connection() as conn:
        fault = request.headers.get("x-fault") or await take_fault(conn, key)
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
    digest = hashlib.sha256(json.dumps({k: str(v) for k, v in payment.items()}, sort_keys=True).encode())
    if fault == "conflict":
        return _key_reused()
    async with request.app.state.db.connection() as conn:
        row, created = await insert_once(conn, key, digest.hexdigest(), payment, operation_id)
    if row[2] != digest.hexdigest():
        return _key_reused()
    if fault == "succeed-then-hang":
        return await _never_answer()
    return JSONResponse(payment_json(row), 201 if created else 200,
                        headers={} if created else {"Idempotent-Replayed": "true"})


def _key_reused() -> Response:
    return JSONResponse({"error": "Idempotency-Key was already used with a different request"}, 409)


async def _never_answer() -> Response:
    await asyncio.sleep(HANG_SECONDS)
    return JSONResponse({"error": "gave up hanging"}, 504)


async def insert_once(conn, key: str, digest: str, payment: dict, operation_id: str | None) -> tuple[tuple, bool]:
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
    return row, created


async def find_payments(request: Request) -> Response:
    key = request.query_params.get("idempotency_key")
    await note_request(request, key or "")
    operation_id = request.query_params.get("operation_id")
    if bool(key) == bool(operation_id):
        return JSONResponse({"error": "give idempotency_key or operation_id"}, 400)
    if key:
        return await _one(request, f"SELECT {COLUMNS} FROM payments WHERE idempotency_key = %s", key)
    return await _one(request, f"SELECT {COLUMNS} FROM payments WHERE operation_id = %s ORDER BY created_at LIMIT 1",
                      operation_id)


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
            "INSERT INTO faults (key, mode, remaining) VALUES (%s, %s, %s) "
            "ON CONFLICT (key) DO UPDATE SET mode = excluded.mode, remaining = excluded.remaining",
            [request.path_params["key"], body["mode"], body.get("times")])
    return JSONResponse({"key": request.path_params["key"], "mode": body["mode"], "times": body.get("times")})


async def clear_fault(request: Request) -> Response:
    async with request.app.state.db.connection() as conn:
        await conn.execute("DELETE FROM faults WHERE key = %s", [request.path_params["key"]])
    return Response(status_code=204)


def build_app(database_url: str) -> Starlette:
    return Starlette(
        routes=[
            Route("/payments", create_payment, methods=["POST"]),
            Route("/payments", find_payments, methods=["GET"]),
            Route("/payments/{payment_id}", get_payment, methods=["GET"]),
            Route("/faults/{key}", set_fault, methods=["PUT"]),
            Route("/faults/{key}", clear_fault, methods=["DELETE"]),
            Route("/healthz", healthz, methods=["GET"]),
        ],
        lifespan=service_lifespan(database_url, SCHEMA),
        exception_handlers=EXCEPTION_HANDLERS,
    )


if __name__ == "__main__":
    import uvicorn

    args = arg_parser("Run the payment gateway.", 8001, "payment_gateway").parse_args()
    uvicorn.run(build_app(args.database_url), host=args.host, port=args.port, log_level="warning")
