"""Traces in one process: the spans of a call, the ids its rows keep, a job continuing the trace it was
queued in, and the exporter the OTEL_* variables choose (OTLP, checked against a real HTTP receiver).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django_q.models import OrmQ
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import ValidationError

from tests.support.approvals_support import call
from tests.support.mcp_client import call_sync
from tests.support.processes import ROOT, WebServer, free_port
from tests.support.task_stack import wait_until
from tools_app.conf import IdemopsSettings, override_conf
from tools_app.core import jobs, tracing
from tools_app.models import AuditEvent

ORDER = {"customer": "ACME", "currency": "EUR", "items": [{"sku": "A", "quantity": 1, "unit_price": "1.00"}]}


@pytest.fixture
def spans():
    """The spans this process finishes from now on."""
    exporter = InMemorySpanExporter()
    trace.get_tracer_provider().add_span_processor(SimpleSpanProcessor(exporter))
    yield exporter
    exporter.clear()
    exporter.shutdown()  # the processor stays registered but exports nowhere


def named(exporter: InMemorySpanExporter, name: str):
    return [span for span in exporter.get_finished_spans() if span.name == name]


def test_a_calls_spans_share_one_trace_whose_ids_its_record_and_audit_events_keep(caller, spans):
    result = call(caller, "create_order", idempotency_key="o-1", **ORDER)

    [tool] = named(spans, "tool create_order")
    [claim] = named(spans, "idempotency.claim")
    record = result.record
    assert claim.context.trace_id == tool.context.trace_id and claim.parent.span_id == tool.context.span_id
    assert (record.trace_id, record.span_id) == (format(tool.context.trace_id, "032x"),
                                                 format(tool.context.span_id, "016x"))
    assert set(AuditEvent.objects.filter(object_type="idempotencyrecord", object_id=str(record.pk))
               .values_list("trace_id", flat=True)) == {
        record.trace_id}
    assert tool.attributes["idemops.outcome"] == "executed" and claim.attributes["idemops.claimed"] is True
    # No exporter was configured when this process started: its SQL statements have no spans (psycopg's
    # instrumentation is installed with an exporter; the OTLP test below sees them).
    assert not any(span.attributes.get("db.system") for span in spans.get_finished_spans())


def test_a_queued_job_carries_the_trace_and_runs_in_a_span_of_it(transactional_db, spans):
    with tracing.span("the caller") as caller_span:
        jobs.enqueue("metrics.prune", task_name="traced-job")
    task = OrmQ.objects.get().task  # the signed payload, as a worker reads it
    caller_trace, _ = tracing.ids(caller_span)

    assert tracing.context_from(task[jobs.TRACE_KEY]) is not None
    assert task[jobs.TRACE_KEY]["traceparent"].split("-")[1] == caller_trace
    # the worker's side of django-q2's signals
    jobs.open_job_span(task=task)
    inside, _ = tracing.ids()
    jobs.close_job_span(task={**task, "success": True})
    assert inside == caller_trace
    [job] = named(spans, "job metrics.prune")
    assert job.kind == trace.SpanKind.CONSUMER and format(job.context.trace_id, "032x") == caller_trace
    assert tracing.ids() == ("", "")  # the worker's context is back as it was


def test_work_on_a_stored_row_continues_its_trace_and_a_row_without_one_gets_its_own(spans):
    stored_trace, stored_span = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    with tracing.continued(stored_trace, stored_span, "later work"):
        later = tracing.ids()
    with tracing.continued("not-a-w3c-trace-id", "", "older row"):
        older = tracing.ids()

    [span] = named(spans, "later work")
    assert later[0] == stored_trace and format(span.parent.span_id, "016x") == stored_span
    assert older[0] and older[0] != stored_trace


def test_the_otel_variables_choose_the_exporter_and_refuse_what_idemops_cannot_do(settings):
    override_conf(settings, otel_traces_exporter=None, otel_exporter_otlp_endpoint=None)
    assert tracing.exporters() == []
    override_conf(settings, otel_exporter_otlp_endpoint="http://collector:4318")
    assert [type(e) for e in tracing.exporters()] == [OTLPSpanExporter]
    override_conf(settings, otel_traces_exporter=["console", "none"])
    assert [type(e) for e in tracing.exporters()] == [ConsoleSpanExporter]
    for wrong in ({"OTEL_TRACES_EXPORTER": "zipkin"}, {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}):
        with pytest.raises(ValidationError):
            IdemopsSettings.model_validate(wrong)


def test_with_nothing_to_receive_them_spans_are_not_recorded_yet_the_call_keeps_its_trace_id(caller):
    provider = tracing.Provider(tracing.Sampler(1.0), id_generator=tracing.IdGenerator())
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("tool create_order") as current:
        result = call(caller, "create_order", idempotency_key="o-unrecorded", **ORDER)
        trace_id, span_id = tracing.ids(current)
    assert not current.is_recording() and current.get_span_context().is_valid
    record = result.record
    assert record.trace_id == trace_id and len(trace_id) == 32 and int(trace_id, 16)
    assert AuditEvent.objects.filter(object_type="idempotencyrecord", object_id=str(record.pk),
                                     trace_id=trace_id).exists()

    # a caller's sampled trace is passed on sampled (a downstream system that exports records its part)
    callers = tracing.remote_parent("4bf92f3577b34da6a3ce929d0e0e4736")
    with tracer.start_as_current_span("tool create_order", context=callers) as followed:
        assert tracing.carrier()["traceparent"].endswith("-01")
    assert followed.get_span_context().trace_flags.sampled

    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with tracer.start_as_current_span("tool create_order"):
        pass
    assert [span.name for span in exporter.get_finished_spans()] == ["tool create_order"]


# Run in a process of its own: this one's provider receives spans once any test here adds a processor.
OUR_SPANS_UNRECORDED = """
import django, json
django.setup()
from opentelemetry import trace
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from tools_app.core import tracing
tracing.configure()
seen = {}
with tracing.continued("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", "task.step s", attempt=1) as step:
    seen["recorded"] = step.is_recording()
    seen["ids"] = tracing.ids(step)
    seen["traceparent"] = tracing.carrier()["traceparent"]
    with tracing.span("inner") as inner:
        seen["inner"] = [inner.is_recording(), tracing.ids(inner)[0], tracing.carrier()["traceparent"][-2:]]
with tracing.span("new trace") as fresh:
    seen["fresh"] = [fresh.is_recording(), tracing.carrier()["traceparent"][-2:]]
exporter = InMemorySpanExporter()
trace.get_tracer_provider().add_span_processor(SimpleSpanProcessor(exporter))
with tracing.continued("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", "task.step s", attempt=1) as step:
    seen["received"] = step.is_recording()
seen["exported"] = [(span.name, dict(span.attributes)) for span in exporter.get_finished_spans()]
print(json.dumps(seen))
"""


def test_with_nothing_to_receive_them_our_spans_in_a_sampled_trace_pass_it_on_unrecorded():
    """A span continuing a stored row's trace (sampled, so that it is passed on sampled) is not built as a
    recorded span that nothing would read; what it passes on is what the recorded span would."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "idemops.settings"}
    for name in ("OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        env.pop(name, None)
    done = subprocess.run([sys.executable, "-c", OUR_SPANS_UNRECORDED], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    trace_id, span_id = seen["ids"]
    assert not seen["recorded"] and trace_id == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert span_id not in ("00f067aa0ba902b7", "0" * 16) and len(span_id) == 16
    assert seen["traceparent"] == f"00-{trace_id}-{span_id}-01"  # passed on sampled, as the recorded span did
    assert seen["inner"] == [False, trace_id, "00"]  # a local child: the sampler's decision, as before
    assert seen["fresh"] == [False, "02"]  # a new trace, not sampled (its id random, as the SDK flags it)
    # Once something receives spans, the same span is recorded, with its attributes.
    assert seen["received"] is True and seen["exported"] == [["task.step s", {"attempt": 1}]]


# In a process of its own too: whether spans are received is the process's provider's state.
HTTP_SPAN_ONLY_WHEN_RECEIVED = """
import asyncio, django, json
django.setup()
from opentelemetry import trace
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from tools_app.core import tracing
tracing.configure()
seen = []

async def app(scope, receive, send):
    current = trace.get_current_span()
    seen.append([current.is_recording(), *tracing.ids(current)])

async def request():
    scope = {"type": "http", "method": "POST", "path": "/mcp", "raw_path": b"/mcp", "query_string": b"",
             "scheme": "http", "http_version": "1.1", "server": ("127.0.0.1", 80), "client": ("127.0.0.1", 9),
             "headers": [(b"host", b"127.0.0.1"),
                         (b"traceparent", b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")]}
    async def receive(): return {"type": "http.request", "body": b"", "more_body": False}
    async def send(message): pass
    await tracing.TracedASGI(app)(scope, receive, send)

asyncio.run(request())
exporter = InMemorySpanExporter()
trace.get_tracer_provider().add_span_processor(SimpleSpanProcessor(exporter))
asyncio.run(request())
print(json.dumps({"seen": seen, "exported": [span.name for span in exporter.get_finished_spans()]}))
"""


def test_the_http_requests_span_is_built_only_where_spans_are_received_and_its_trace_context_always_followed():
    """With nothing receiving spans, /mcp's ASGI layer makes the request's `traceparent` current and builds
    no span (the call's own spans follow it, unrecorded); once something receives them, OpenTelemetry's
    ASGI middleware records the HTTP request's span, in the same trace."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "idemops.settings"}
    for name in ("OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        env.pop(name, None)
    done = subprocess.run([sys.executable, "-c", HTTP_SPAN_ONLY_WHEN_RECEIVED], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    unreceived, received = answer["seen"]
    # the caller's context itself, no span of the server's between
    assert unreceived == [False, "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"]
    assert received[:2] == [True, "4bf92f3577b34da6a3ce929d0e0e4736"] and received[2] != "00f067aa0ba902b7"
    assert answer["exported"] == ["POST /mcp"]


def test_the_sampler_ratio_records_that_share_of_new_traces_and_follows_a_callers_decision():
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    def recorded(ratio: float, parent_flags: TraceFlags | None = None) -> int:
        provider = tracing.Provider(tracing.Sampler(ratio), id_generator=tracing.IdGenerator())
        provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
        tracer = provider.get_tracer("test")
        context = None if parent_flags is None else trace.set_span_in_context(NonRecordingSpan(SpanContext(
            trace_id=0x4BF92F3577B34DA6A3CE929D0E0E4736, span_id=0x00F067AA0BA902B7, is_remote=True,
            trace_flags=parent_flags)))
        count = 0
        for _ in range(400):
            with tracer.start_as_current_span("call", context=context) as span:
                count += span.is_recording()
        return count

    assert recorded(1.0) == 400 and recorded(0.0) == 0
    assert 100 < recorded(0.5) < 300
    assert recorded(0.0, TraceFlags(TraceFlags.SAMPLED)) == 400  # the caller sampled its trace
    assert recorded(1.0, TraceFlags(TraceFlags.DEFAULT)) == 0  # the caller did not
    assert IdemopsSettings.model_validate({"OTEL_TRACES_SAMPLER_ARG": "0.25"}).otel_traces_sampler_arg == 0.25
    with pytest.raises(ValidationError):
        IdemopsSettings.model_validate({"OTEL_TRACES_SAMPLER_ARG": "2"})


class Collector:
    """An OTLP/HTTP receiver: keeps every ExportTraceServiceRequest posted to /v1/traces."""

    def __init__(self):
        self.port = free_port()
        self.requests: list[ExportTraceServiceRequest] = []
        received = self.requests

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.path == "/v1/traces":
                    received.append(ExportTraceServiceRequest.FromString(body))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def spans(self) -> list:
        return [span for request in self.requests for resource in request.resource_spans
                for scope in resource.scope_spans for span in scope.spans]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.live
def test_with_an_otlp_endpoint_set_the_web_process_exports_its_calls_spans(transactional_db, token, spans):
    # `spans`: this process records (and so samples) the client's span, whose context the call carries;
    # the web process follows the caller's decision, so the call's spans are recorded there too.
    collector = Collector()
    web = WebServer("web-otlp", OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{collector.port}",
                    OTEL_BSP_SCHEDULE_DELAY="100", OTEL_SERVICE_NAME="idemops-under-test")
    try:
        call_sync(web.mcp_url, token, "create_order", {**ORDER, "idempotency_key": "o-otlp"})
        from tools_app.models import IdempotencyRecord

        trace_id = bytes.fromhex(IdempotencyRecord.objects.get(key="o-otlp").trace_id)
        expected = {"tools/call create_order", "tool create_order", "idempotency.claim"}
        wait_until(lambda: {s.name for s in collector.spans() if s.trace_id == trace_id} >= expected, timeout=30,
                   what=f"the call's spans at the collector (got {[s.name for s in collector.spans()]})")
        # psycopg's instrumentation: the call's SQL statements, each a span of the call's trace
        wait_until(lambda: any(attribute.key == "db.system" and attribute.value.string_value == "postgresql"
                               for s in collector.spans() if s.trace_id == trace_id for attribute in s.attributes),
                   timeout=30, what="the call's SQL statements at the collector")
    finally:
        web.stop()
        collector.close()
    # The HTTP request has its span too (the ASGI instrumentation); the client put the call's own trace
    # context in params._meta, which the MCP span follows.
    assert [span for span in collector.spans() if span.name.startswith("POST")]
    services = {attribute.value.string_value for request in collector.requests for resource in
                request.resource_spans for attribute in resource.resource.attributes if attribute.key == "service.name"}
    assert services == {"idemops-under-test"}
