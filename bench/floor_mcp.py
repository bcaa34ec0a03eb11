"""The anchor of P10: the physical floor of an idempotent write over MCP.

The bare `mcp` SDK (`MCPServer`, stateless Streamable HTTP at /mcp, as bench/bare_mcp.py) whose one
tool, `create_order`, does in ONE transaction on the same PostgreSQL what any correct idempotent write
must: claim the key (`INSERT … ON CONFLICT DO NOTHING RETURNING`), insert the order, store the result
on the key (`UPDATE`), `COMMIT`. psycopg, one connection per thread, in worker threads as many as
idemops' web process has. No auth, no audit, no validation beyond the SDK's own. A key already
claimed answers its stored result. Nothing else, so the ratio of idemops' `create_order` to this is the cost of
everything idemops adds.

Its two tables are its own (created if missing) in the database of DATABASE_URL:

    DATABASE_URL=postgres://… .venv/bin/granian --interface asgi bench.floor_mcp:app --port 8100
"""

from __future__ import annotations

import functools
import json
import os
import threading
from decimal import Decimal
from typing import Any

import anyio
import anyio.to_thread
import psycopg
from mcp.server.mcpserver import MCPServer
from mcp.server.transport_security import TransportSecuritySettings

SCHEMA = """
CREATE TABLE IF NOT EXISTS floor_key (key text PRIMARY KEY, result jsonb);
CREATE TABLE IF NOT EXISTS floor_order (id bigserial PRIMARY KEY, customer text NOT NULL, items jsonb NOT NULL,
                                        currency text NOT NULL, total numeric NOT NULL);
"""

_local = threading.local()


def _connection() -> psycopg.Connection[Any]:
    conn: psycopg.Connection[Any] | None = getattr(_local, "conn", None)
    if conn is None or conn.closed:
        conn = _local.conn = psycopg.connect(os.environ["DATABASE_URL"])
    return conn


def _schema() -> None:
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(24)")  # two web processes may start at once
        conn.execute(SCHEMA)
        conn.execute("SELECT pg_advisory_unlock(24)")


server = MCPServer(name="floor")


# As many database threads (so connections) as idemops' web process uses (IDEMOPS_MCP_DB_THREADS' default):
# the SDK's own thread pool for sync tools is 40, and four servers' connections must fit the cluster's.
_threads = anyio.CapacityLimiter(16)


@server.tool()
async def create_order(customer: str, items: list[dict[str, Any]], currency: str,
                       idempotency_key: str) -> dict[str, Any]:
    """Creates an order once per idempotency key."""
    return await anyio.to_thread.run_sync(
        functools.partial(_create_order, customer, items, currency, idempotency_key), limiter=_threads)


def _create_order(customer: str, items: list[dict[str, Any]], currency: str, idempotency_key: str) -> dict[str, Any]:
    conn = _connection()
    with conn.transaction():
        claimed = conn.execute("INSERT INTO floor_key (key) VALUES (%s) ON CONFLICT DO NOTHING RETURNING key",
                               (idempotency_key,)).fetchone()
        if claimed is None:
            stored = conn.execute("SELECT result FROM floor_key WHERE key = %s", (idempotency_key,)).fetchone()
            return {**(stored[0] if stored and stored[0] else {}), "replayed": True}
        total = sum(Decimal(str(item["unit_price"])) * int(item["quantity"]) for item in items)
        order_id = conn.execute(
            "INSERT INTO floor_order (customer, items, currency, total) VALUES (%s, %s, %s, %s) RETURNING id",
            (customer, json.dumps(items), currency, total)).fetchone()[0]  # type: ignore[index]  # RETURNING: a row
        result = {"order_id": order_id, "total": str(total), "currency": currency}
        conn.execute("UPDATE floor_key SET result = %s WHERE key = %s", (json.dumps(result), idempotency_key))
    return {**result, "replayed": False}


_schema()
app = server.streamable_http_app(
    streamable_http_path="/mcp", stateless_http=True,
    transport_security=TransportSecuritySettings(allowed_hosts=["127.0.0.1:*", "localhost:*"],
                                                 allowed_origins=["http://127.0.0.1:*"]))
