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
from pathlib import Path

from django.db import connection

ROOT = Path(__file__).resolve().parent.parent
LOG_DIR = ROOT / "var" / "test-logs"


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
    env = os.environ.copy()
    env.update(DJANGO_SETTINGS_MODULE="idemops.settings", DATABASE_URL=test_database_url(), **extra)
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

    def wait_http(self, url: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited: {self.log_tail()}")
            try:
                with urllib.request.urlopen(url, timeout=2):
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"{self.name} not ready at {url}: {self.log_tail()}")

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
        self._log.close()


class WebServer(Service):
    def __init__(self, name: str = "web", **env: str):
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        super().__init__(name, [sys.executable, "-m", "uvicorn", "idemops.asgi:application", "--host", "127.0.0.1",
                                "--port", str(self.port), "--no-access-log"],
                         child_env(IDEMOPS_PUBLIC_URL=self.base_url, **env))
        self.wait_http(f"{self.base_url}/healthz")

    @property
    def mcp_url(self) -> str:
        return f"{self.base_url}/mcp"


class Worker(Service):
    """A django-q2 cluster (`manage.py qcluster`): its sentinel and workers share one process group."""

    def __init__(self, name: str = "qcluster", **env: str):
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        self._log_start = (LOG_DIR / f"{name}.log").stat().st_size if (LOG_DIR / f"{name}.log").exists() else 0
        super().__init__(name, [sys.executable, "manage.py", "qcluster"], child_env(**env))
        self.wait_log("running.")

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
