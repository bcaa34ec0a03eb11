"""A scripted agent against a running idemops, through a network that misbehaves.

    python -m idemops_client.demo --url http://127.0.0.1:8000/mcp --token idm_...

The demo starts a fault-injecting proxy on loopback in front of the server
and makes the calls an agent would make: orders (one answer lost after the
server acted, one connection cut mid-call, one 503, one held back past the
client's timeout), a payment (a high-risk tool: the client asks
prepare_operation for its operation id and carries it verbatim; its answer is
lost), a notification, a long task (a document ingestion, which needs the job
workers `make run` starts), a deterministic error, and a re-planned duplicate
of the first order.

Then it counts side effects without trusting the client: every answer the
server sent (the proxy kept them, delivered or not) must name one resource
per operation, and the read tools must find one order per order placed, one
document for the ingested text, the notification, and (get_operation) the
one payment the issued operation id names. The last
line ends in `duplicates N`; the exit status is 1 if N > 0, 2 if a call did
not end as planned, 0 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from mcp_types import ElicitResult

from idemops_client.canonical import business_arguments, canonical_json
from idemops_client.client import CallResult, IdempotentClient, operation_status
from idemops_client.errors import ToolCallError
from idemops_client.faults import FaultProxy
from idemops_client.ledger import Ledger
from idemops_client.retry import RetryPolicy

RESULT_IDS = ("order_id", "payment_id", "notification_id", "document_id", "task_id", "ticket_id")
ORDER_PROBE_LIMIT = 300


@dataclass
class Report:
    lines: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    operations: int = 0
    from_ledger: int = 0
    not_retried: int = 0
    issued: int = 0  # high-risk calls made under an operation id the server issued
    payment: CallResult | None = None

    def say(self, text: str) -> None:
        self.lines.append(text)
        print(text, flush=True)


async def run(url: str, token: str, *, ledger_path: Path, session_id: str, tag: str) -> int:
    report = Report()
    parts = urlsplit(url)
    upstream = f"{parts.scheme}://{parts.netloc}"
    policy = RetryPolicy(max_attempts=10, max_seconds=120, attempt_timeout=30)
    async with FaultProxy(upstream) as proxy:
        ledger = Ledger(ledger_path)
        try:
            async with IdempotentClient(proxy.url_for(url), token, ledger=ledger, session_id=session_id,
                                        policy=policy, elicitation=PersonSaysYes(report)) as client:
                await place_orders(client, proxy, report, tag)
                await other_writes(client, proxy, report, tag)
                await replan_and_mistake(client, proxy, report, tag)
                await proxy.settle()
                duplicates = await verify(client, proxy, report, tag)
                report.say("")
                report.say("What the agent loop tells the model:")
                report.say(client.ledger.summary_for_model())
        finally:
            ledger.close()
    faults = sum(1 for e in proxy.exchanges if e.fault)
    retries = sum(1 for e in proxy.calls() if e.key) - len({(e.tool, e.key) for e in proxy.calls() if e.key})
    for problem in report.problems:
        print(f"problem: {problem}", file=sys.stderr)
    print(f"demo: {report.operations} operations, {faults} faults injected, {retries} retries with the same key, "
          f"{report.from_ledger} answered from the ledger, {report.not_retried} deterministic error not retried, "
          f"{report.issued} high-risk call under a server-issued operation id, duplicates {duplicates}", flush=True)
    if duplicates:
        return 1
    return 2 if report.problems else 0


class PersonSaysYes:
    """The person behind the demo's agent: shown what a tool asks them to confirm (a small payment,
    through MCP elicitation), they say yes. A real host asks its user."""

    def __init__(self, report: Report) -> None:
        self.report = report

    async def __call__(self, context: Any, params: Any) -> ElicitResult:
        self.report.say(f"  the person behind the agent is asked: {params.message} -> confirms")
        return ElicitResult(action="accept", content={"confirm": True})


async def step(report: Report, what: str, call: Any) -> CallResult | None:
    try:
        result: CallResult = await call
    except ToolCallError as error:
        report.problems.append(f"{what}: {error}")
        report.say(f"{what}: {error}")
        return None
    report.operations += 1
    marks = [f"{result.attempts} attempt{'s' if result.attempts != 1 else ''}"]
    if result.replayed:
        marks.append("the retry got the first call's result")
    ids = ", ".join(f"{k.removesuffix('_id')} {result.structured[k]}" for k in RESULT_IDS if k in result.structured)
    report.say(f"{what}: {ids} ({'; '.join(marks)})")
    return result


def order(tag: str, n: int) -> dict[str, Any]:
    return {"customer": f"{tag}-customer-{n}", "currency": "EUR",
            "items": [{"sku": f"BOLT-{n}", "quantity": 3, "unit_price": "2.50"}]}


async def place_orders(client: IdempotentClient, proxy: FaultProxy, report: Report, tag: str) -> None:
    proxy.inject("drop_response", "create_order")
    await step(report, "order 1, answer lost after the server acted", client.call("create_order", order(tag, 1)))
    proxy.inject("disconnect", "create_order", seconds=0.05)
    await step(report, "order 2, connection cut mid-call", client.call("create_order", order(tag, 2)))
    proxy.inject("unavailable", "create_order", retry_after=1)
    await step(report, "order 3, HTTP 503 + Retry-After first", client.call("create_order", order(tag, 3)))
    # Held past the client's timeout: the retry runs first, the late original is a replay.
    proxy.inject("delay", "create_order", seconds=3)
    await step(report, "order 4, held back past the client's 1.5 s timeout",
               client.call("create_order", order(tag, 4),
                           policy=RetryPolicy(max_attempts=10, max_seconds=60, attempt_timeout=1.5)))


async def other_writes(client: IdempotentClient, proxy: FaultProxy, report: Report, tag: str) -> None:
    proxy.inject("drop_response", "request_payment")
    report.payment = await step(report, "payment, answer lost", client.call("request_payment", {
        "amount": "12.34", "currency": "EUR", "payee": f"{tag} supplier", "reference": f"{tag}-invoice-1"}))
    issued = {str((e.structured or {}).get("operation_id")) for e in proxy.calls("prepare_operation")}
    sent = {e.key for e in proxy.calls("request_payment")}
    if report.payment is not None and sent == {report.payment.key} and report.payment.key in issued:
        report.issued += 1
        report.say(f"  its operation id {report.payment.key} was issued by the server (prepare_operation) and "
                   "carried verbatim on every attempt")
    elif report.payment is not None:
        report.problems.append(f"the payment went out under {sorted(str(key) for key in sent)}, "
                               "not one id the server issued")
    proxy.inject("disconnect", "send_notification", seconds=0.05)
    await step(report, "notification, connection cut", client.call("send_notification", {
        "channel": "email", "recipient": "ops@example.com", "subject": f"Orders placed ({tag})",
        "body": "Four orders and a payment were placed by the demo agent."}))
    proxy.inject("unavailable", "ingest_document", retry_after=1)
    text = (f"# Demo report {tag}\n\nThe idemops demo {tag} ingests this document once, however often the "
            "network fails.\n\n" + "An agent retries with the same key. " * 40)
    await step(report, "long task (ingest_document), 503 first, then asked again while it runs",
               client.call("ingest_document", {"text": text, "filename": f"{tag}.md"}))


async def replan_and_mistake(client: IdempotentClient, proxy: FaultProxy, report: Report, tag: str) -> None:
    before = len(proxy.calls("create_order"))
    # The model lost track and plans order 1 again, spelled differently: other key order, 3.0 for 3.
    first = order(tag, 1)
    again = {"items": [{"unit_price": "2.50", "quantity": 3.0, "sku": first["items"][0]["sku"]}],
             "currency": "EUR", "customer": first["customer"]}
    result = await client.call("create_order", again)
    sent = len(proxy.calls("create_order")) - before
    report.operations += 1
    if result.from_ledger and sent == 0:
        report.from_ledger += 1
        report.say(f"re-planned order 1: answered from the ledger, order {result['order_id']}, no request sent")
    else:
        report.problems.append(f"the re-planned order was sent ({sent} requests), not answered from the ledger")
    before = len(proxy.calls("create_order"))
    try:
        await client.call("create_order", {"customer": "x", "currency": "euro",
                                           "items": [{"sku": "A", "quantity": 1, "unit_price": "1"}]})
        report.problems.append("an invalid order was accepted")
    except ToolCallError as error:
        sent = len(proxy.calls("create_order")) - before
        report.operations += 1
        if error.error_class == "invalid_input" and sent == 1:
            report.not_retried += 1
            report.say(f"invalid order: {error.error_class}, sent once, not retried")
        else:
            report.problems.append(f"invalid order: {error.error_class} after {sent} requests")


async def verify(client: IdempotentClient, proxy: FaultProxy, report: Report, tag: str) -> int:
    """Count side effects from the wire and through the read tools; return the duplicates found.

    Two independent counts of the same effects; the larger is reported (each is
    a lower bound: the wire sees every answer the server sent, the read tools
    see what the database holds).
    """
    report.say("")
    report.say("Checking for duplicates:")
    # 1. The wire: per operation (tool + canonical business arguments), the resources the server's answers named,
    #    delivered or not. Two orders for one operation show up as two order ids.
    keys, resources = _seen_on_the_wire(proxy)
    wire = wire_duplicates(resources)
    report.say(f"- on the wire: {len(keys)} operations reached the server with {sum(len(v) for v in keys.values())} "
               f"keys and named {sum(len(v) for v in resources.values())} resources; duplicates {wire}")
    # 2. The read tools: every order of this run, by probing ids around the ones we got.
    customers = await _orders_of_run(client, resources, tag)
    order_duplicates = sum(n - 1 for n in customers.values())
    report.say(f"- get_order: {len(customers)} orders of this run found, {sum(customers.values())} rows; "
               f"duplicates {order_duplicates}")
    if len(customers) != 4:
        report.problems.append(f"expected 4 orders of this run, found {len(customers)}")
    # 3. The notification and the document.
    for _, value in {x for op in resources.values() for x in op if x[0] == "notification_id"}:
        found = await client.call("get_notification", {"notification_id": value})
        report.say(f"- get_notification: {value[:8]}… {found['status']}")
    # 4. The payment, by the operation id it was made under: the server's one operation, with our payment.
    payment_duplicates = 0
    if report.payment is not None:
        found = await client.call("get_operation", {"operation_id": report.payment.key})
        status = operation_status(found["status"])
        same = (status, (found["result"] or {}).get("payment_id")) == ("succeeded", report.payment["payment_id"])
        payment_duplicates = 0 if same else 1
        report.say(f"- get_operation: payment operation {status}, payment "
                   f"{(found['result'] or {}).get('payment_id')}; duplicates {payment_duplicates}")
    # By words only: a document holding this run's phrase is one this run made. (By meaning, the default
    # hybrid mode, any other document of the tenant is a hit too, and was once counted as a duplicate.)
    hits = await client.call("search_documents", {"query": f'"idemops demo {tag}"', "mode": "keyword", "limit": 50})
    documents = {hit["document_id"] for hit in hits["hits"]}
    document_duplicates = max(0, len(documents) - 1)
    report.say(f"- search_documents: {len(documents)} document(s) with this run's text; "
               f"duplicates {document_duplicates}")
    if not documents:
        report.problems.append("the ingested document is not found")
    return int(max(wire, order_duplicates + document_duplicates + payment_duplicates))


Operation = tuple[str | None, str]  # (tool, canonical business arguments)
Named = set[tuple[str, Any]]  # the resources an operation's answers named: (result field, id)


def _seen_on_the_wire(proxy: FaultProxy) -> tuple[dict[Operation, set[str | None]], dict[Operation, Named]]:
    """Per operation, the keys it was sent with and the resources the server's answers named (delivered or not)."""
    keys: defaultdict[Operation, set[str | None]] = defaultdict(set)
    resources: defaultdict[Operation, Named] = defaultdict(set)
    for exchange in proxy.calls():
        if exchange.key is None or exchange.arguments is None or exchange.reply is None:
            continue  # a request the server never saw (a 503 from the proxy) did nothing
        operation = (exchange.tool, canonical_json(business_arguments(exchange.arguments)))
        keys[operation].add(exchange.key)
        structured = exchange.structured or {}
        if not structured.get("error"):
            resources[operation] |= {(k, str(structured[k])) for k in RESULT_IDS if k in structured}
    return keys, resources


async def _orders_of_run(client: IdempotentClient, resources: dict[Operation, Named], tag: str) -> dict[str, int]:
    """Rows per customer of this run's orders (get_order), probing ids from the first order id the wire named."""
    ids = sorted(int(v) for op in resources.values() for k, v in op if k == "order_id")
    customers: defaultdict[str, int] = defaultdict(int)
    if ids:
        for order_id in range(ids[0], min(ids[-1] + 6, ids[0] + ORDER_PROBE_LIMIT)):
            try:
                found = await client.call("get_order", {"order_id": order_id})
            except ToolCallError:
                continue
            if str(found["customer"]).startswith(f"{tag}-"):
                customers[found["customer"]] += 1
    return customers


def wire_duplicates(resources: dict[Any, set[Any]]) -> int:
    """Per operation, more than one resource of a kind (two order ids) is a duplicate."""
    total = 0
    for named in resources.values():
        per_kind = Counter(kind for kind, _ in named)
        total += sum(n - 1 for n in per_kind.values())
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m idemops_client.demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="the MCP endpoint, e.g. http://127.0.0.1:8000/mcp")
    parser.add_argument("--token", required=True, help="a tenant's API token")
    parser.add_argument("--ledger", type=Path, help="the ledger file (default: a temporary file)")
    parser.add_argument("--session", help="the session id (default: a new one)")
    args = parser.parse_args(argv)
    tag = f"demo-{uuid.uuid4().hex[:8]}"
    session_id = args.session or tag
    if args.ledger is not None:
        return asyncio.run(run(args.url, args.token, ledger_path=args.ledger, session_id=session_id, tag=tag))
    with tempfile.TemporaryDirectory() as tmp:
        return asyncio.run(run(args.url, args.token, ledger_path=Path(tmp) / "calls.sqlite", session_id=session_id,
                               tag=tag))


if __name__ == "__main__":
    sys.exit(main())
