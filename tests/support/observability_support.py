"""What the observability tests share: a web process and a cluster of their own (their own log
files, DEBUG level), reading those logs as JSON lines, and calling in a known trace."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from tests.support.processes import LOG_DIR, WebServer, Worker, downstream_env
from tools_app.core import tracing

METRICS_TOKEN = "scrape-token-" + "q7" * 10


class Observed:
    """A web process and a django-q2 cluster whose log files this module starts fresh."""

    def __init__(self, gateway, sink, doc_server, **env: str):
        self.gateway, self.sink = gateway, sink
        self.env = {**downstream_env(gateway, sink), "IDEMOPS_LOG_LEVEL": "DEBUG",
                    "IDEMOPS_DOCUMENT_ALLOWED_URL_PREFIXES": doc_server.base_url,
                    "IDEMOPS_TASK_CALL_WAIT_SECONDS": "0", "IDEMOPS_LEASE_SWEEP_SECONDS": "0.2",
                    "IDEMOPS_OUTBOX_BACKOFF_SECONDS": "0.2", "IDEMOPS_METRICS_TOKEN": METRICS_TOKEN, **env}
        for name in ("web-observed", "jobs-observed"):
            (LOG_DIR / f"{name}.log").unlink(missing_ok=True)
        self.web = WebServer("web-observed", **self.env)
        try:
            self.jobs = Worker("jobs-observed", **self.env)
        except BaseException:
            self.web.stop()
            raise

    def logs(self) -> dict[str, str]:
        """Every log file of this stack's processes: name -> text."""
        return {service.name: service.log_path.read_text(errors="replace") for service in (self.web, self.jobs)}

    def stop(self) -> None:
        self.jobs.stop(grace=3)
        self.web.stop()


def lines(text: str) -> list[dict[str, Any]]:
    """The JSON lines of a log (a process writes a few plain lines before its settings are read)."""
    parsed = []
    for line in text.splitlines():
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            parsed.append(value)
    return parsed


def events(text: str, event: str, **fields: Any) -> list[dict[str, Any]]:
    return [line for line in lines(text) if line.get("event") == event
            and all(line.get(key) == value for key, value in fields.items())]


def new_trace() -> tuple[str, str]:
    """A W3C trace id and a parent span id, as a caller's tracer would make them."""
    return secrets.token_hex(16), secrets.token_hex(8)


def traceparent(trace_id: str, span_id: str) -> str:
    return f"00-{trace_id}-{span_id}-01"


@contextmanager
def in_trace(trace_id: str, span_id: str) -> Iterator[None]:
    """Code inside runs as part of the caller's trace (the MCP client then sends it in params._meta)."""
    token = tracing.attach(tracing.remote_parent(trace_id, span_id))
    try:
        yield
    finally:
        tracing.detach(token)


def trace_of(traceparent_header: str) -> str:
    """The trace id of a W3C traceparent header ("" if there is none)."""
    parts = traceparent_header.split("-")
    return parts[1] if len(parts) == 4 else ""


@pytest.fixture(scope="module")
def observed(django_db_setup, django_db_blocker, _gateway, _sink, doc_server):
    """A web process and a cluster for the module using it, logging at DEBUG into fresh files."""
    with django_db_blocker.unblock():
        stack = Observed(_gateway, _sink, doc_server)
    yield stack
    stack.stop()
