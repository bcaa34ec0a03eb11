"""What both downstream services share: their database, its outages, and a command line."""

from __future__ import annotations

import argparse
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import TupleRow
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

logger = logging.getLogger(__name__)

RETRY_AFTER_SECONDS = "1"
CONNECT_TIMEOUT_SECONDS = 2


def ensure_database(url: str) -> None:
    """Create the service's database on its server if it does not exist yet."""
    params = conninfo_to_dict(url)
    name = params["dbname"]
    admin = make_conninfo(url, dbname="postgres")
    with psycopg.connect(admin, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')


class Connections:
    """A fresh connection for each use (`async with db.connection() as conn`: committed on
    success, rolled back on error, then closed).

    Nothing is kept between requests, so nothing goes stale when the database
    restarts: while it is down a request fails at once (503, see below), and
    the first one after it is back succeeds. (A pool keeps broken connections
    and reconnects with a backoff of its own, seconds after the server is
    back.) These are demo services: the cost of a connection is no concern.
    """

    def __init__(self, url: str):
        self.url = url

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection[TupleRow]]:
        async with await psycopg.AsyncConnection.connect(self.url, connect_timeout=CONNECT_TIMEOUT_SECONDS) as conn:
            yield conn


def service_lifespan(url: str, schema: str) -> Callable[[Starlette], AbstractAsyncContextManager[None]]:
    """Starlette lifespan: create the database and schema; requests use `app.state.db`."""

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        ensure_database(url)
        app.state.db = Connections(url)
        async with app.state.db.connection() as conn:
            await conn.execute(schema)
        yield

    return lifespan


async def database_unavailable(request: Request, exc: Exception) -> Response:
    """Starlette exception handler: the service's own database is down or restarting.

    503 with Retry-After, which idemops classifies as `transient` (retry with
    the same key). Safe for the gateway even if a payment did commit: the
    retry carries the same Idempotency-Key and gets that payment back.
    """
    logger.warning("%s %s: database unavailable (%s)", request.method, request.url.path, type(exc).__name__)
    return JSONResponse({"error": "database unavailable, retry later"}, 503,
                        headers={"Retry-After": RETRY_AFTER_SECONDS})


# For Starlette(exception_handlers=...): a refused or broken connection is an OperationalError.
EXCEPTION_HANDLERS = {psycopg.OperationalError: database_unavailable}


async def healthz(request: Request) -> Response:
    """200 when the service's database answers, else 503 (a monitor's view of the service)."""
    async with request.app.state.db.connection() as conn:
        await conn.execute("SELECT 1")
    return JSONResponse({"status": "ok"})


def arg_parser(description: str, default_port: int, default_db: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=default_port)
    parser.add_argument("--database-url", required=True, help=f"e.g. postgresql:///{default_db}?host=/path")
    return parser
