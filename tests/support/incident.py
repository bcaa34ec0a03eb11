"""The downstream outage of issue 36, as an operator would meet it, on a whole stack of its own.

Ten agents keep asking for payments (12.00 EUR, under the approval threshold), each under an
operation id prepare_operation issued, following every answer as the README tells an agent: the
same key again after `retry_after` on `transient`, `in_progress` and `unknown_outcome`. Meanwhile
the payment gateway answers 503 with Retry-After, nothing done, for `outage` seconds (its fault mode
`unavailable`), then commits payments without ever answering for `hang` seconds
(`succeed-then-hang`), then recovers. New payments stop at the recovery; the agents go on until
every key they started has its payment.

Used by tests/incidents/test_outage_ends_by_itself.py (60 s + 30 s) and bench/bench_incident.py
(the gateway down for 10 minutes). The stack runs the documented defaults, except the gateway
timeout the test stack shortens (set back to the default 5 s here).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx2

from tests.support.agents import Answer, call_tool, issued_operation_id
from tests.support.processes import Stack
from tools_app.models import IdempotencyRecord

AGENTS = 10
PAYMENT = {"amount": "12.00", "currency": "EUR", "payee": "Bob", "reference": "incident"}
RECORDS = IdempotencyRecord._meta.db_table
# An agent waits as told, at most this long between two calls (an impatient one asks sooner).
AGENT_MAX_PAUSE = 5.0


@dataclass
class Payment:
    key: str  # the operation id the server issued
    started: float
    answers: list[Answer] = field(default_factory=list)
    done_at: float | None = None


@dataclass
class Report:
    recovered_at: float
    payments: list[Payment]
    held_answers: int  # transient answers that ran nothing (breaker open, pause, in-flight limit)
    gateway_posts: int  # POST /payments the gateway received
    gateway_payments: int
    duplicate_operations: int  # operation ids the gateway paid more than once
    escalated: int  # records left for a person (the UNKNOWN queue, flagged)
    unknown_left: int
    not_executed: int
    unfinished: list[str]
    last_answers: list[str]  # of the unfinished keys: why each agent stopped

    @property
    def slowest_after_recovery(self) -> float:
        """Seconds from the recovery to the last key completed."""
        return max((p.done_at - self.recovered_at for p in self.payments if p.done_at), default=0.0)

    @property
    def unknown_answers(self) -> int:
        return sum(a.error_class == "unknown_outcome" for p in self.payments for a in p.answers)


def stack(workdir: Path) -> Stack:
    return Stack(workdir, "incident", IDEMOPS_PAYMENT_GATEWAY_TIMEOUT_SECONDS="5")


def run(stack: Stack, *, before: float = 5, outage: float = 60, hang: float = 30, settle_timeout: float = 600
        ) -> Report:
    return asyncio.run(_run(stack, before, outage, hang, settle_timeout))


async def _run(stack: Stack, before: float, outage: float, hang: float, settle_timeout: float) -> Report:
    payments: list[Payment] = []
    recovered = asyncio.Event()
    numbers = itertools.count()

    async def agent(client: httpx2.AsyncClient, name: int) -> None:
        while not recovered.is_set():
            n = next(numbers)
            prepare_answers: list[Answer] = []
            key = await issued_operation_id(client, stack.web.mcp_url, stack.token, "request_payment", PAYMENT,
                                            f"agent-{name}-payment-{n}", prepare_answers,
                                            time.monotonic() + settle_timeout)
            payment = Payment(key, time.monotonic())
            payments.append(payment)
            await follow(client, payment)

    async def follow(client: httpx2.AsyncClient, payment: Payment) -> None:
        deadline = time.monotonic() + settle_timeout + outage + hang
        while time.monotonic() < deadline:
            answer = await call_tool(client, stack.web.mcp_url, stack.token, "request_payment",
                                     {**PAYMENT, "idempotency_key": payment.key})
            payment.answers.append(answer)
            if answer.succeeded:
                payment.done_at = answer.at
                return
            if answer.status == 0:
                # No answer at all (the connection broke, e.g. a kept-alive one the server had just
                # closed): re-issue the same call, as the protocol says a client must.
                await asyncio.sleep(0.5)
                continue
            if answer.error_class not in ("transient", "in_progress", "unknown_outcome"):
                return  # final: not_executed, or a failure the report shows
            await asyncio.sleep(min(answer.retry_after, AGENT_MAX_PAUSE) if answer.problem() is None else 0.5)

    async def operator_of_the_gateway() -> float:
        await asyncio.sleep(before)
        await asyncio.to_thread(stack.gateway.set_fault, "*", "unavailable")
        await asyncio.sleep(outage)
        await asyncio.to_thread(stack.gateway.set_fault, "*", "succeed-then-hang")
        await asyncio.sleep(hang)
        await asyncio.to_thread(stack.gateway.clear_fault, "*")
        recovered.set()
        return time.monotonic()

    async with httpx2.AsyncClient(timeout=60) as client:
        agents = [asyncio.create_task(agent(client, n)) for n in range(AGENTS)]
        recovered_at = await operator_of_the_gateway()
        await asyncio.gather(*agents)
    return report(stack, recovered_at, payments)


def report(stack: Stack, recovered_at: float, payments: list[Payment]) -> Report:
    keys = [p.key for p in payments]
    escalated, unknown, not_executed = stack.sql(
        f'SELECT count(*) FILTER (WHERE escalated_at IS NOT NULL), count(*) FILTER (WHERE status = %s), '
        f'count(*) FILTER (WHERE error_class = %s) FROM "{RECORDS}" WHERE tool = %s',
        ["unknown", "not_executed", "request_payment"])[0]
    posts = stack.gateway.sql("SELECT count(*) FROM requests_seen WHERE method = 'POST' AND path = '/payments'")[0][0]
    paid = stack.gateway.sql("SELECT count(*) FROM payments WHERE operation_id = ANY(%s)", [keys])[0][0]
    duplicates = stack.gateway.sql("SELECT count(*) FROM (SELECT operation_id FROM payments WHERE operation_id = "
                                   "ANY(%s) GROUP BY operation_id HAVING count(*) > 1) d", [keys])[0][0]
    held = sum(1 for p in payments for a in p.answers
               if a.error_class == "transient" and {"circuit_open", "paused", "in_flight_limit"} & set(a.error or {}))
    unfinished = [p for p in payments if p.done_at is None]
    return Report(recovered_at, payments, held, posts, paid, duplicates, escalated, unknown, not_executed,
                  [p.key for p in unfinished],
                  [f"{a.status} {a.error_class}: {a.body[:300]}" for p in unfinished for a in p.answers[-1:]])
