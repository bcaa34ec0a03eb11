"""PgBouncer (Debian's package) in front of the test PostgreSQL, in transaction mode, as a process.

`.ci/run` installs it; elsewhere the tests that need it skip, naming the package. It runs as the
embedded server's system user when we are root (PgBouncer refuses to run as root).
"""

from __future__ import annotations

import os
import shutil
import socket
import time
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from tests.support.processes import VAR_DIR, Service, free_port, test_database_url

ADMIN_DATABASE = "pgbouncer"


def executable() -> str:
    found = shutil.which("pgbouncer") or shutil.which("pgbouncer", path="/usr/sbin:/usr/local/sbin")
    if found is None:
        pytest.skip("pgbouncer is not installed (apt-get install pgbouncer; .ci/run does): the pooler tests skip")
    return found


class PgBouncer(Service):
    """PgBouncer on 127.0.0.1:<port>, pooling every database of the test server in transaction mode."""

    def __init__(self, name: str = "pgbouncer", pool_size: int = 10, **options: str):
        program = executable()
        target = conninfo_to_dict(test_database_url())
        self.user = str(target["user"])
        self.port = free_port()
        self.pool_size = pool_size
        directory = VAR_DIR / "test-pgbouncer"
        directory.mkdir(parents=True, exist_ok=True)
        settings = {
            "listen_addr": "127.0.0.1", "listen_port": str(self.port), "unix_socket_dir": "",
            "auth_type": "trust", "auth_file": str(directory / "userlist.txt"), "admin_users": self.user,
            "pool_mode": "transaction", "default_pool_size": str(pool_size), "max_client_conn": "500",
            # psycopg sends no startup parameter PgBouncer does not know; Django's are set per statement.
            "ignore_startup_parameters": "extra_float_digits", **options,
        }
        (directory / "userlist.txt").write_text(f'"{self.user}" ""\n')
        config = directory / f"{name}.ini"
        config.write_text("\n".join([
            "[databases]",
            f"* = host={target['host']} port={target.get('port') or 5432}",
            "[pgbouncer]", *(f"{key} = {value}" for key, value in settings.items()), ""]))
        as_user = ["runuser", "-u", "embedded_postgres", "--"] if os.geteuid() == 0 else []
        super().__init__(name, [*as_user, program, str(config)], dict(os.environ))
        self._wait_listening()

    def _wait_listening(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"pgbouncer exited: {self.log_tail()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"pgbouncer not listening on {self.port}: {self.log_tail()}")

    def url(self, database: str | None = None) -> str:
        """The test database (or `database`) through the pooler, as DATABASE_URL takes it."""
        name = database or conninfo_to_dict(test_database_url())["dbname"]
        return f"postgresql://{self.user}:@127.0.0.1:{self.port}/{name}"

    def show(self, what: str) -> list[dict[str, Any]]:
        """`SHOW <what>` on PgBouncer's admin console (STATS, POOLS, SERVERS, CLIENTS), as dicts."""
        with psycopg.connect(self.url(ADMIN_DATABASE), autocommit=True) as conn:
            cursor = conn.cursor()
            cursor.execute(f"SHOW {what}", prepare=False)  # the admin console prepares nothing
            columns = [column.name for column in cursor.description or ()]
            return [dict(zip(columns, row, strict=True)) for row in cursor.fetchall()]
