"""What both downstream services share: their database and a command line."""

from __future__ import annotations

import argparse
from contextlib import asynccontextmanager

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import AsyncConnectionPool


def ensure_database(url: str) -> None:
    """Create the service's database on its server if it does not exist yet."""
    params = conninfo_to_dict(url)
    name = params["dbname"]
    admin = make_conninfo(url, dbname="postgres")
    with psycopg.connect(admin, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')


def service_lifespan(url: str, schema: str):
    """Starlette lifespan: create the database and schema, open a connection pool."""

    @asynccontextmanager
    async def lifespan(app):
        ensure_database(url)
        async with AsyncConnectionPool(url, min_size=1, max_size=10, open=False) as pool:
            async with pool.connection() as conn:
                await conn.execute(schema)
            app.state.pool = pool
            yield

    return lifespan


def arg_parser(description: str, default_port: int, default_db: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=default_port)
    parser.add_argument("--database-url", required=True, help=f"e.g. postgresql:///{default_db}?host=/path")
    return parser
