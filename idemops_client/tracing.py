"""One trace per operation, from the agent: W3C trace context in every attempt's `_meta.traceparent`.

An operation (one `call()`, all its attempts) gets a span: a child of the caller's current
OpenTelemetry span when there is one (the agent's turn, or the host's `_meta.traceparent`
that the proxy's server side continued), else the root of a new trace. Each attempt is a
child span of it, linked to the attempt before, and its context travels in
`_meta.traceparent` (MCP SEP-414), so the server's record, task, downstream requests and
approval join the agent's trace.

Without an OpenTelemetry SDK configured (the API's no-op provider), or without OpenTelemetry
at all, the ids are made here: a trace id is still sent, and the server still records it.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator
from typing import Any

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace as otel_trace
    from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, Status, StatusCode, TraceFlags
    HAVE_OTEL = True
except ImportError:  # pragma: no cover (the mcp SDK depends on opentelemetry-api; kept optional here)
    HAVE_OTEL = False

TRACER_NAME = "idemops_client"


def traceparent(trace_id: str, span_id: str, sampled: bool = True) -> str:
    return f"00-{trace_id}-{span_id}-{'01' if sampled else '00'}"


class OperationTrace:
    """The spans of one operation. `with trace.attempt() as meta:` around each attempt gives
    the `_meta` entries (`traceparent`) to send with it."""

    def __init__(self, name: str, attributes: dict[str, str] | None = None):
        self.name = name
        self.attempts = 0
        self._previous: Any = None  # the previous attempt's SpanContext, for the link
        self._span: Any = None
        self.trace_id: str
        self.span_id: str
        if not HAVE_OTEL:
            self.trace_id, self.span_id = secrets.token_hex(16), secrets.token_hex(8)
            return
        tracer = otel_trace.get_tracer(TRACER_NAME)
        span = tracer.start_span(f"idemops {name}", attributes=attributes or {})
        context = span.get_span_context()
        if not span.is_recording() and (not context.is_valid or context == _current_context()):
            # The no-op provider: a child is its parent, or nothing. Ids of our own, under the caller's trace if any.
            trace_id = context.trace_id if context.is_valid else int(secrets.token_hex(16), 16)
            context = SpanContext(trace_id=trace_id, span_id=int(secrets.token_hex(8), 16), is_remote=False,
                                  trace_flags=TraceFlags(TraceFlags.SAMPLED))
            span = NonRecordingSpan(context)
        self._span = span
        self.trace_id = format(context.trace_id, "032x")
        self.span_id = format(context.span_id, "016x")

    @contextlib.contextmanager
    def attempt(self) -> Iterator[dict[str, str]]:
        """A span for one attempt (linked to the one before), current while the request is sent."""
        self.attempts += 1
        if not HAVE_OTEL:
            yield {"traceparent": traceparent(self.trace_id, secrets.token_hex(8))}
            return
        tracer = otel_trace.get_tracer(TRACER_NAME)
        links = [Link(self._previous, {"idemops.link": "retry of"})] if self._previous is not None else []
        span = tracer.start_span(f"idemops attempt {self.name}", context=otel_trace.set_span_in_context(self._span),
                                 links=links, attributes={"idemops.attempt": self.attempts})
        context = span.get_span_context()
        if not span.is_recording():
            context = SpanContext(trace_id=int(self.trace_id, 16), span_id=int(secrets.token_hex(8), 16),
                                  is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))
            span = NonRecordingSpan(context)
        self._previous = context
        token = otel_context.attach(otel_trace.set_span_in_context(span))
        try:
            yield {"traceparent": traceparent(self.trace_id, format(context.span_id, "016x"))}
        finally:
            otel_context.detach(token)
            span.end()

    def end(self, error_class: str | None = None) -> None:
        if self._span is None:
            return
        if error_class is not None:
            self._span.set_attribute("idemops.error_class", error_class)
            self._span.set_status(Status(StatusCode.ERROR, error_class))
        self._span.end()


def _current_context() -> Any:
    assert otel_trace is not None
    return otel_trace.get_current_span().get_span_context()
