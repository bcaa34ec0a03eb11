"""One trace from the agent (issue 25 §3): every attempt of an operation carries the agent's trace
in `_meta.traceparent`, and the server's record joins it."""

import asyncio
import json
import subprocess
import sys

import pytest
from opentelemetry import trace

from idemops_client import IdempotentClient, MemoryLedger, RetryPolicy
from idemops_client.faults import FaultProxy
from tests.support.processes import ROOT
from tools_app.engine.models import IdempotencyRecord

QUICK = RetryPolicy(max_attempts=6, max_seconds=60, base_delay=0.05, max_delay=0.5, attempt_timeout=10)
ORDER = {"customer": "ACME", "currency": "EUR", "items": [{"sku": "BOLT-1", "quantity": 3, "unit_price": "2.50"}]}


def parts(traceparent: str) -> tuple[str, str]:
    version, trace_id, span_id, flags = traceparent.split("-")
    assert version == "00" and len(trace_id) == 32 and len(span_id) == 16 and len(flags) == 2
    return trace_id, span_id


@pytest.mark.live
def test_every_attempt_of_an_operation_carries_the_callers_trace_and_the_record_joins_it(web_server, token):
    async def scenario():
        async with FaultProxy(web_server.base_url) as proxy:
            proxy.inject("drop_response", "create_order")
            async with IdempotentClient(proxy.url_for(web_server.mcp_url), token, ledger=MemoryLedger(),
                                        policy=QUICK) as client:
                with trace.get_tracer("the-agent").start_as_current_span("agent turn") as turn:
                    result = await client.call("create_order", ORDER)
            return result, proxy.calls("create_order"), format(turn.get_span_context().trace_id, "032x")

    result, requests, agent_trace = asyncio.run(scenario())

    sent = [parts(r.meta["traceparent"]) for r in requests]
    assert len(sent) == 2
    assert {trace_id for trace_id, _ in sent} == {agent_trace} and result.trace_id == agent_trace
    assert sent[0][1] != sent[1][1]  # two attempts, two spans of one trace
    assert IdempotencyRecord.objects.get(key=result.key).trace_id == agent_trace


SPANS = r"""
import json
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from idemops_client.tracing import OperationTrace

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
operation = OperationTrace("create_order")
sent = []
for _ in range(3):
    with operation.attempt() as meta:
        sent.append(meta["traceparent"])
operation.end()
spans = {s.context.span_id: s for s in exporter.get_finished_spans()}
print(json.dumps({"sent": sent, "spans": [
    {"name": s.name, "trace": format(s.context.trace_id, "032x"), "span": format(s.context.span_id, "016x"),
     "parent": format(s.parent.span_id, "016x") if s.parent else None,
     "links": [format(link.context.span_id, "016x") for link in s.links]} for s in spans.values()]}))
"""

NO_PROVIDER = r"""
import asyncio, json
from idemops_client.tracing import OperationTrace
operation = OperationTrace("create_order")
sent = []
for _ in range(2):
    with operation.attempt() as meta:
        sent.append(meta["traceparent"])
print(json.dumps({"sent": sent, "trace_id": operation.trace_id}))
"""


def run_python(code: str) -> dict:
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_retries_of_one_operation_are_linked_child_spans_of_its_span():
    found = run_python(SPANS)

    operation = next(s for s in found["spans"] if s["name"] == "idemops create_order")
    attempts = [s for s in found["spans"] if s["name"].startswith("idemops attempt")]
    assert len(attempts) == 3 and {s["trace"] for s in found["spans"]} == {operation["trace"]}
    assert all(s["parent"] == operation["span"] for s in attempts)
    by_sent = [next(s for s in attempts if s["span"] == parts(tp)[1]) for tp in found["sent"]]
    assert [s["links"] for s in by_sent] == [[], [by_sent[0]["span"]], [by_sent[1]["span"]]]


def test_without_a_tracer_provider_a_trace_id_is_still_made_and_sent():
    found = run_python(NO_PROVIDER)

    sent = [parts(tp) for tp in found["sent"]]
    assert {trace_id for trace_id, _ in sent} == {found["trace_id"]} and int(found["trace_id"], 16) != 0
    assert sent[0][1] != sent[1][1]
