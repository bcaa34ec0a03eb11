"""Structured logs: one configuration for every process, and one chain every line passes.

Each process (uvicorn's workers, the django-q2 cluster, `manage.py` commands) logs through the
handler idemops/settings.py's LOGGING installs, whose formatter is `Formatter` below. Lines
from idemops' own code (`logs.get(__name__).info("tool.call", outcome=...)`, structlog) and
from libraries (Django, django-q2, uvicorn, the MCP SDK: the standard library's logging) go
through the same processors:

1. the call's context (`bound`: tenant, tool, task, ...) and the current trace and span ids;
2. an exception, rendered to text (so that the next step sees it);
3. `redaction.redact_log_line`: tokens, auditor keys, passwords, raw idempotency keys and the
   call's personal values (`scrubbing`) never leave the process;
4. JSON, one object a line, or text for a person at a terminal (IDEMOPS_LOG_FORMAT).

structlog rather than python-json-logger: its processor chain is the one place both kinds of
line pass, so redaction cannot be skipped by a library's logger, and its context variables
follow a call into the database thread it runs on (anyio copies them).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any
from urllib.parse import urlsplit

import structlog
from opentelemetry import trace
from structlog.typing import EventDict, Processor

from tools_app.core import redaction

get = structlog.stdlib.get_logger

# Values that must not appear in any line logged in this context, with what stands for them.
_scrubbed: ContextVar[tuple[tuple[str, str], ...]] = ContextVar("log_scrubbed_values", default=())


@contextmanager
def bound(**fields: Any) -> Iterator[None]:
    """`fields` on every line logged inside (and in threads that copy this context).

    structlog's tokens put back what each field was before (`bound_contextvars` would copy the whole
    context to learn it: about three times the cost, on every call)."""
    tokens = structlog.contextvars.bind_contextvars(**{k: v for k, v in fields.items() if v not in (None, "")})
    try:
        yield
    finally:
        structlog.contextvars.reset_contextvars(**tokens)


def context() -> dict[str, Any]:
    """The fields bound in this context (the tenant and tool of the call being worked on)."""
    return structlog.contextvars.get_contextvars()


@contextmanager
def scrubbing(values: Iterable[tuple[str, str]]) -> Iterator[None]:
    """Inside, every occurrence of each value (a raw key, a personal argument) in a log line, its
    traceback included, is replaced by its stand-in."""
    added = tuple((value, stand_in) for value, stand_in in values if len(value) >= redaction.MIN_SCRUBBED_LENGTH)
    token = _scrubbed.set(_scrubbed.get() + added)
    try:
        yield
    finally:
        _scrubbed.reset(token)


def scrubbed_values() -> tuple[tuple[str, str], ...]:
    return _scrubbed.get()


# --- processors ------------------------------------------------------------------------------------


def add_trace_ids(logger: Any, method: str, event: EventDict) -> EventDict:
    """The current OpenTelemetry span's trace and span ids, so a line can be found from a trace."""
    context = trace.get_current_span().get_span_context()
    if context.is_valid:
        event.setdefault("trace_id", format(context.trace_id, "032x"))
        event.setdefault("span_id", format(context.span_id, "016x"))
    return event


_ACCESS = re.compile(r'(?P<client>\S+) - "(?P<method>\S+) (?P<path>\S+) HTTP/(?P<version>[^"]+)" (?P<status>\d+)')


def access_line(logger: Any, method: str, event: EventDict) -> EventDict:
    """uvicorn's or granian's access log as fields; the path without its query (it may carry a signed token)."""
    record = event.get("_record")
    if record is None or record.name not in ("uvicorn.access", "granian.access"):
        return event
    match = _ACCESS.fullmatch(str(event.get("event", "")))
    if match is None:
        return event
    event.update(event="http.request", method=match["method"], url_path=urlsplit(match["path"]).path,
                 status=int(match["status"]), http_version=match["version"], client=match["client"])
    return event


def drop_empty(logger: Any, method: str, event: EventDict) -> EventDict:
    """Fields with no value are left out of the line."""
    return {key: value for key, value in event.items() if value is not None}


def scrub_context_values(logger: Any, method: str, event: EventDict) -> EventDict:
    return redaction.redact_log_line(event, _scrubbed.get())


def _shared() -> list[Processor]:
    return [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        add_trace_ids,
    ]


_configured = False


def configure() -> None:
    """structlog's own loggers hand their lines to the standard library, where `Formatter` finishes them."""
    global _configured
    if _configured:
        return
    structlog.configure(
        processors=[structlog.stdlib.filter_by_level, *_shared(),
                    structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    _configured = True


class Formatter(structlog.stdlib.ProcessorFormatter):
    """The formatter of every handler (LOGGING in idemops/settings.py): `kind` is IDEMOPS_LOG_FORMAT."""

    def __init__(self, kind: str = "auto", stream: Any = None):
        configure()
        stream = stream or sys.stderr
        human = kind == "console" or (kind == "auto" and hasattr(stream, "isatty") and stream.isatty())
        renderer = (structlog.dev.ConsoleRenderer(colors=stream.isatty()) if human
                    else structlog.processors.JSONRenderer(default=str, ensure_ascii=False))
        super().__init__(
            foreign_pre_chain=[*_shared(), access_line],
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                        structlog.processors.format_exc_info, scrub_context_values, drop_empty, renderer],
        )
