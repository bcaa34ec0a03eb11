"""Traces (OpenTelemetry): one trace per tool call, followed through everything the call starts.

- `configure()` (at start-up, tools_app/apps.py): this process's tracer provider, always, so a
  call has a trace id even when nothing is exported (its spans are then not recorded: `Sampler`);
  the exporter the standard `OTEL_*` variables choose (read into the settings object:
  `OTEL_TRACES_EXPORTER`; OTLP over HTTP when an `OTEL_EXPORTER_OTLP_*ENDPOINT` is set, else
  none); Django's instrumentation, and psycopg's (a span per SQL statement) when an exporter is set.
- `span(name, ...)` and `ids()`: a span of our own (`opened` and `current` for one whose work
  pauses and goes on), and the current trace and span ids as
  stored on records, tasks, step runs, approval requests, outbox events and audit events.
- `continued(trace_id, span_id, name)`: work done later by another process (a task's steps, an
  outbox delivery, a reconciliation, an approved execution) joins the trace of the call that
  started it, from the ids stored with its row.
- `send(client, request)` and `request(...)`: an outbound HTTP request (the payment gateway, a
  webhook, a document fetch) in a CLIENT span whose context travels in its `traceparent`
  header. The MCP SDK's HTTP client is httpx2, which OpenTelemetry's httpx instrumentation
  does not patch: this is the one helper every outbound request goes through instead.
- `carrier()` / `context_from(carrier)`: the W3C trace context as a dict (an email header, a
  django-q2 job's payload: core/jobs.py).

On the MCP side the SDK's own OpenTelemetryMiddleware opens a span per message, parented on
`params._meta.traceparent` (MCP SEP-414) when the call carries one and otherwise on the HTTP
request's context: `TracedASGI` around /mcp, OpenTelemetry's ASGI middleware (an HTTP span) where
spans are received, else the `traceparent` header's context made current with no span built.
"""

from __future__ import annotations

import os
import random
import re
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from contextvars import Token
from typing import Any, cast

import httpx2
from django.conf import settings as django_settings
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware, asgi_getter
from opentelemetry.instrumentation.django import DjangoInstrumentor
from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider, sampling
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from starlette.types import ASGIApp, Receive, Scope, Send

from tools_app.conf import conf
from tools_app.core.redaction import public_url

tracer = trace.get_tracer("idemops")

TRACE_ID = re.compile(r"[0-9a-f]{32}")
SPAN_ID = re.compile(r"[0-9a-f]{16}")


_configured = False


class IdGenerator(RandomIdGenerator):
    """Trace and span ids drawn from a generator of their own. The SDK's default draws from the
    `random` module, so every span would shift the jitter drawn after it (core.backoff) and a
    seeded run would no longer repeat. Reseeded in a forked child (django-q2's workers), as
    `random` itself is, so no two workers draw the same ids."""

    def __init__(self) -> None:
        self._random = random.Random()
        os.register_at_fork(after_in_child=self._random.seed)

    def generate_span_id(self) -> int:
        return self._random.getrandbits(64) or 1

    def generate_trace_id(self) -> int:
        return self._random.getrandbits(128) or 1


class Sampler(sampling.Sampler):
    """Parent-based, with `OTEL_TRACES_SAMPLER_ARG` the share of new traces recorded; and, while no span
    processor would receive a span (no exporter configured), nothing recorded but the traces a caller
    sampled (its `traceparent`, or a stored row's: `remote_parent`). A span not recorded still
    has its trace and span ids, so records, audit rows, log lines and `traceparent` headers keep them;
    only the span's attributes and events, which nothing would read, are not built."""

    def __init__(self, ratio: float) -> None:
        self.receiving = False  # set by Provider once a span processor is added
        self._ratio = ratio
        self._inner = sampling.ParentBased(sampling.TraceIdRatioBased(ratio))

    def should_sample(self, parent_context: otel_context.Context | None, trace_id: int, name: str,
                      kind: SpanKind | None = None, attributes: Any = None, links: Any = None,
                      trace_state: Any = None) -> sampling.SamplingResult:
        if not self.receiving:
            # A caller's sampled trace stays sampled in what this process passes on (traceparent), so
            # a downstream system that exports still records its part of it.
            parent = trace.get_current_span(parent_context).get_span_context()
            if not (parent.is_valid and parent.is_remote and parent.trace_flags.sampled):
                return _NOT_RECORDED
        return self._inner.should_sample(parent_context, trace_id, name, kind, attributes, links, trace_state)

    def get_description(self) -> str:
        return f"idemops(ParentBased(TraceIdRatioBased({self._ratio})), recorded only when received)"


_NOT_RECORDED = sampling.SamplingResult(sampling.Decision.DROP)


class Provider(TracerProvider):
    """The SDK's provider, telling its sampler when something receives spans (an exporter, a test's)."""

    def __init__(self, sampler: Sampler, **options: Any) -> None:
        super().__init__(sampler=sampler, **options)
        self._receiving_sampler = sampler

    def add_span_processor(self, span_processor: SpanProcessor) -> None:
        super().add_span_processor(span_processor)
        self._receiving_sampler.receiving = True

    @property
    def receiving(self) -> bool:
        """Whether a span processor would receive a recorded span."""
        return self._receiving_sampler.receiving


PROBES_MIDDLEWARE = "tools_app.web.health.ProbesMiddleware"


def configure() -> None:
    """This process's tracer provider and instrumentation (once; OTEL_SDK_DISABLED=true: none)."""
    global _configured
    settings = conf()
    if _configured or settings.otel_sdk_disabled:
        return
    provider = Provider(Sampler(settings.otel_traces_sampler_arg),
                        resource=Resource.create({SERVICE_NAME: settings.otel_service_name}),
                        id_generator=IdGenerator())
    chosen = exporters()
    for exporter in chosen:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    if chosen:
        # A span per SQL statement, only where spans are exported: without an exporter they would be
        # dropped, and building them cost about a tenth of a write's time over /mcp (docs/performance.md).
        PsycopgInstrumentor().instrument(tracer_provider=provider, skip_dep_check=True)
    # Its middleware goes after the probes' (tools_app.web.health.ProbesMiddleware), not first: it reads the
    # Host header on every request (build_absolute_uri), and an orchestrator probing by address must not
    # meet the ALLOWED_HOSTS check. (The probes are not traced anyway.)
    middleware = list(django_settings.MIDDLEWARE)
    after_probes = middleware.index(PROBES_MIDDLEWARE) + 1 if PROBES_MIDDLEWARE in middleware else 0
    DjangoInstrumentor().instrument(tracer_provider=provider, excluded_urls="livez,readyz,healthz,metrics",
                                    middleware_position=after_probes)
    _configured = True


def exporters() -> list[SpanExporter]:
    """The span exporters OTEL_TRACES_EXPORTER names; unset, OTLP when an OTLP endpoint is set and
    none otherwise (traces still exist: their ids are in the database and the logs). The OTLP
    exporter reads its endpoint, headers and timeout from the OTEL_EXPORTER_OTLP_* variables itself."""
    settings = conf()
    names = settings.otel_traces_exporter
    if names is None:
        names = ["otlp"] if settings.otel_exporter_otlp_traces_endpoint or settings.otel_exporter_otlp_endpoint \
            else []
    return [OTLPSpanExporter() if name == "otlp" else ConsoleSpanExporter() for name in names if name != "none"]


def receiving() -> bool:
    """Whether a recorded span would reach anything (an exporter, a test's processor)."""
    provider = trace.get_tracer_provider()
    return not isinstance(provider, Provider) or provider.receiving


class TracedASGI:
    """Around an ASGI app: OpenTelemetry's ASGI middleware (an HTTP server span per request, from its
    `traceparent` header) while spans are received; otherwise only the request's trace context
    (`traceparent`, through the configured propagators) made current, which is all a span that is
    not recorded would pass on. Checked per request, so a processor added later is served spans."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.traced = OpenTelemetryMiddleware(app, exclude_spans=["receive", "send"])

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or receiving():
            await self.traced(scope, receive, send)
            return
        # The getter reads an ASGI scope's headers (it is typed for a dict; Starlette types the scope as a mapping).
        token = otel_context.attach(propagate.extract(cast(dict[str, Any], scope), getter=asgi_getter))
        try:
            await self.app(scope, receive, send)
        finally:
            otel_context.detach(token)


# --- spans and ids ---------------------------------------------------------------------------------


# `kind` is positional-only so that attributes given as keyword arguments (`**{...}`, dotted names) are never
# taken for it.
def span(name: str, kind: SpanKind = SpanKind.INTERNAL, /, **attributes: Any) -> AbstractContextManager[trace.Span]:
    """A span of ours around a piece of work, current inside (attributes with None are left out)."""
    return trace.use_span(_started(name, None, kind, attributes), end_on_exit=True)


def opened(name: str, kind: SpanKind = SpanKind.INTERNAL, /, **attributes: Any) -> trace.Span:
    """A span of ours for work that pauses and goes on (a call that waits: core.polling.Pending):
    made current by `current(span)` for each part, ended by its owner."""
    return _started(name, None, kind, attributes)


def _started(name: str, context: otel_context.Context | None, kind: SpanKind, attributes: dict[str, Any]
             ) -> trace.Span:
    """`tracer.start_span`, but not recorded where it would be recorded for nothing. With no span
    processor (nothing exported) the `Sampler` records only a span whose parent is a caller's sampled
    trace (a `traceparent`, a stored row's ids: `remote_parent`), so that what this process passes on
    stays sampled; a span that nothing reads, with its attributes checked one by one (20 µs a span).
    That span is then a non-recording one with what the recorded one would pass on: the parent's
    trace id and trace state, a span id of its own, the sampled flag (and the random-trace-id flag
    where the parent had it)."""
    if not receiving():
        parent = trace.get_current_span(context).get_span_context()
        if parent.is_valid and parent.is_remote and parent.trace_flags.sampled:
            provider = cast(Provider, trace.get_tracer_provider())  # not receiving: ours
            return NonRecordingSpan(SpanContext(
                parent.trace_id, provider.id_generator.generate_span_id(), is_remote=False,
                trace_flags=TraceFlags(parent.trace_flags & _PASSED_ON), trace_state=parent.trace_state))
    return tracer.start_span(name, context=context, kind=kind,
                             attributes={k: v for k, v in attributes.items() if v is not None})


_PASSED_ON = TraceFlags.SAMPLED | TraceFlags.RANDOM_TRACE_ID


def current(opened_span: trace.Span) -> AbstractContextManager[trace.Span]:
    """`opened_span` current inside, left open on exit (an exception is recorded on it)."""
    return trace.use_span(opened_span, end_on_exit=False, record_exception=True, set_status_on_exception=True)


def ids(current: trace.Span | None = None) -> tuple[str, str]:
    """(trace id, span id) of the current span as 32 and 16 hex digits; ("", "") outside any."""
    context = (current or trace.get_current_span()).get_span_context()
    if not context.is_valid:
        return "", ""
    return format(context.trace_id, "032x"), format(context.span_id, "016x")


def remote_parent(trace_id: str, span_id: str = "") -> otel_context.Context | None:
    """A context whose parent is the span `span_id` of trace `trace_id` (stored ids), or None if
    `trace_id` is not a W3C trace id (rows older than tracing, a caller's free-form id)."""
    if not trace_id or not TRACE_ID.fullmatch(trace_id) or trace_id == "0" * 32:
        return None
    if not (span_id and SPAN_ID.fullmatch(span_id) and int(span_id, 16)):
        # No span stored: a parent of its own per trace, so everything continued from it hangs together.
        span_id = trace_id[16:] if int(trace_id[16:], 16) else "1".rjust(16, "0")
    parent = SpanContext(trace_id=int(trace_id, 16), span_id=int(span_id, 16), is_remote=True,
                         trace_flags=TraceFlags(TraceFlags.SAMPLED))
    return trace.set_span_in_context(NonRecordingSpan(parent))


@contextmanager
def continued(trace_id: str, span_id: str, name: str, kind: SpanKind = SpanKind.INTERNAL, /,
              **attributes: Any) -> Iterator[trace.Span]:
    """A span `name` in the trace stored with a row (see `remote_parent`); in the current trace if none."""
    started = _started(name, remote_parent(trace_id, span_id), kind, attributes)
    with trace.use_span(started, end_on_exit=True) as current:
        yield current


def carrier() -> dict[str, str]:
    """The current trace context as W3C headers (`traceparent`, and `tracestate` if any)."""
    headers: dict[str, str] = {}
    propagate.inject(headers)
    return headers


def context_from(headers: dict[str, str] | None) -> otel_context.Context | None:
    """The context a carrier (headers, a job's payload) holds; None if it holds none."""
    if not headers:
        return None
    context = propagate.extract(headers)
    return context if trace.get_current_span(context).get_span_context().is_valid else None


def set_span(current: trace.Span) -> otel_context.Context:
    return trace.set_span_in_context(current)


def attach(context: otel_context.Context) -> Token[otel_context.Context]:
    return otel_context.attach(context)


def detach(token: Token[otel_context.Context]) -> None:
    otel_context.detach(token)


# --- outbound HTTP ----------------------------------------------------------------------------------


def send(client: httpx2.Client, request: httpx2.Request, *, shown_url: str | None = None,
         **options: Any) -> httpx2.Response:
    """Send `request` inside a CLIENT span; its trace context goes along as `traceparent`.

    `shown_url` is the URL as the span may show it (never its query: signed-URL tokens live there).
    """
    url = public_url(shown_url or str(request.url))
    with tracer.start_as_current_span(f"{request.method}", kind=SpanKind.CLIENT, attributes={
            "http.request.method": request.method, "url.full": url,
            "server.address": httpx2.URL(shown_url).host if shown_url else request.url.host}) as current:
        propagate.inject(request.headers)
        response = client.send(request, **options)
        current.set_attribute("http.response.status_code", response.status_code)
        if response.status_code >= 500:
            current.set_status(Status(StatusCode.ERROR))
        return response


def request(method: str, url: str, *, timeout: float, **options: Any) -> httpx2.Response:
    """`httpx2.request`, traced (see `send`)."""
    with httpx2.Client(timeout=timeout) as client:
        return send(client, client.build_request(method, url, **options))
