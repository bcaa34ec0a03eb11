"""Issue 9 (4): how soon keys settle after a fault: from the fault to every key answering its settled state.

A whole stack of its own (tests.support.processes.Stack: web, a django-q2 cluster,
the payment gateway, on an embedded PostgreSQL of its own in a temporary
directory) with the default lease settings. Three faults:

1. A web process SIGKILLed mid-call with keys claimed: create_order calls
   held inside their transaction (a lock their INSERT waits for) and
   request_payment calls held by the gateway (half paid, half not), each
   under an operation id prepare_operation issued before. Agents retry
   every key through another web process.
2. The same, with nobody asking: the cluster's loop alone settles the keys.
3. PostgreSQL stopped for two seconds and started again under agents
   (each payment is two writes: prepare_operation, then request_payment).

"Settled" is a call answering the key's real state: its result (executed
or replayed) or `unknown_outcome` (reconciliation under way), never
`in_progress`. Agents retry every 0.5 s at most, or sooner if told.
`run(quick=True)` runs it with few keys and a 2 s lease (a test runs it so
it cannot rot). Alone: `.venv/bin/python bench/run.py settle`.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx2
import psycopg

from idemops_demo.models import Order
from tests.support.agents import Answer, call_tool, call_until_done, issued_operation_id
from tests.support.processes import Stack
from tools_app.conf import conf
from tools_app.models import IdempotencyRecord

ORDER = {"customer": "ACME", "items": [{"sku": "BOLT-1", "quantity": 1, "unit_price": "2.50"}], "currency": "EUR"}
PAYMENT = {"amount": "10.00", "currency": "EUR", "payee": "Bob", "reference": "settle"}
AGENT_MAX_PAUSE = 0.5
OUTAGE_SECONDS = 2
RECORDS = IdempotencyRecord._meta.db_table
FINAL = ("succeeded", "failed")


@dataclass
class Key:
    tool: str
    key: str
    answers: list[Answer] = field(default_factory=list)

    @property
    def arguments(self) -> dict:
        if self.tool == "prepare_operation":
            return {"tool": "request_payment", "arguments": PAYMENT, "idempotency_key": self.key}
        return {**(ORDER if self.tool == "create_order" else PAYMENT), "idempotency_key": self.key}

    def first_settled(self, after: float) -> float | None:
        """When a call after `after` first answered the key's real state."""
        return next((a.at for a in self.answers
                     if a.at > after and (a.succeeded or a.error_class == "unknown_outcome")), None)

    def succeeded_at(self) -> float | None:
        return next((a.at for a in self.answers if a.succeeded), None)


def keys_for(stack: Stack, label: str, per_tool: int) -> list[Key]:
    """Order keys, and payments under operation ids the server issued before the fault (request_payment
    takes no other key)."""
    async def issue(n: int) -> Key:
        async with httpx2.AsyncClient(timeout=30) as client:
            prepared = Key("prepare_operation", f"{label}-prepare-{n}")
            return Key("request_payment", await issued_operation_id(
                client, stack.web.mcp_url, stack.token, "request_payment", PAYMENT, prepared.key, prepared.answers,
                time.monotonic() + 60))

    async def issue_all() -> list[Key]:
        return list(await asyncio.gather(*(issue(n) for n in range(per_tool))))

    return [Key("create_order", f"{label}-order-{n}") for n in range(per_tool)] + asyncio.run(issue_all())


async def retry_all(stack: Stack, keys: list[Key], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    async with httpx2.AsyncClient(timeout=30) as client:
        await asyncio.gather(*(call_until_done(client, stack.web.mcp_url, stack.token, k.tool, k.arguments,
                                               k.answers, deadline, max_pause=AGENT_MAX_PAUSE) for k in keys))


def wait_until(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.05)


# --- fault 1 and 2: a web process SIGKILLed with keys claimed ------------------------------------------


def kill_mid_call(stack: Stack, keys: list[Key], label: str) -> float:
    """Start every key's first call on a web process of its own, wait until all are claimed and
    in flight (payments: the paid half paid), SIGKILL it. Returns the time of the kill."""
    payments = [k for k in keys if k.tool == "request_payment"]
    paid_half, unpaid_half = payments[:len(payments) // 2], payments[len(payments) // 2:]
    orders = [k for k in keys if k.tool == "create_order"]
    # Enough database threads that every call is in flight at once (each held call keeps one).
    victim = stack.web_server(f"victim-{label}", IDEMOPS_PAYMENT_GATEWAY_TIMEOUT_SECONDS="300",
                              IDEMOPS_MCP_DB_THREADS=str(len(keys) + 8))
    # Orders wait inside their transaction, after the claim, for this lock on their table.
    lock = psycopg.connect(stack.database.url)
    lock.execute(f'LOCK TABLE "{Order._meta.db_table}" IN EXCLUSIVE MODE')

    async def first_calls() -> None:
        async with httpx2.AsyncClient(timeout=300) as client:
            calls = []
            # The gateway's next requests: half paid then never answered, half never paid.
            for batch, fault in ((paid_half, "succeed-then-hang"), (unpaid_half, "hang")):
                stack.gateway.set_fault("*", fault, times=len(batch))
                calls += [asyncio.create_task(call_tool(client, victim.mcp_url, stack.token, k.tool, k.arguments))
                          for k in batch]
                await asyncio.to_thread(wait_until, lambda: faults_left(stack) == 0, 60, f"{fault} requests")
            calls += [asyncio.create_task(call_tool(client, victim.mcp_url, stack.token, k.tool, k.arguments))
                      for k in orders]
            await asyncio.to_thread(wait_until, lambda: in_flight(stack, keys), 60, "calls in flight")
            assert len(paid(stack, payments)) == len(paid_half)
            await asyncio.to_thread(victim.kill)
            await asyncio.gather(*calls)  # each ends with the connection the kill broke

    try:
        asyncio.run(first_calls())
        return time.monotonic()
    finally:
        lock.close()  # the dead process's transactions abort; nothing of them commits


def faults_left(stack: Stack) -> int:
    rows = stack.gateway.sql("SELECT remaining FROM faults WHERE key = '*'")
    return rows[0][0] if rows else 0


def in_flight(stack: Stack, keys: list[Key]) -> bool:
    """Every payment claimed (its record committed, PROCESSING) and every order waiting for the lock
    inside its transaction (a local tool's claim commits with its effect, so nobody sees it yet)."""
    payments = [k.key for k in keys if k.tool == "request_payment"]
    claimed = stack.sql(f'SELECT count(*) FROM "{RECORDS}" WHERE status = %s AND key = ANY(%s)',
                        ["processing", payments])[0][0]
    waiting = stack.sql("SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = %s::regclass",
                        [Order._meta.db_table])[0][0]
    return claimed == len(payments) and waiting == len(keys) - len(payments)


def all_final(stack: Stack, keys: list[Key]) -> bool:
    """Every payment's record final; the killed orders left nothing behind (their next call runs them)."""
    payments = [k.key for k in keys if k.tool == "request_payment"]
    final = stack.sql(f'SELECT count(*) FROM "{RECORDS}" WHERE status = ANY(%s) AND key = ANY(%s)',
                      [list(FINAL), payments])[0][0]
    open_orders = stack.sql(f'SELECT count(*) FROM "{RECORDS}" WHERE status <> ALL(%s) AND key = ANY(%s)',
                            [list(FINAL), [k.key for k in keys if k.tool == "create_order"]])[0][0]
    return final == len(payments) and open_orders == 0


def paid(stack: Stack, keys: list[Key]) -> list[str]:
    """The gateway's payments for these keys (by the key each record forwarded: one payment each)."""
    forwarded = list(stack.forwarded_keys(k.key for k in keys if k.tool == "request_payment").values())
    return [key for (key,) in stack.gateway.sql("SELECT idempotency_key FROM payments WHERE idempotency_key = ANY(%s)",
                                                [forwarded])]


def once_each(stack: Stack, keys: list[Key]) -> bool:
    """Every key took effect exactly once: one order per create_order key, one payment per request_payment key."""
    orders = [k.key for k in keys if k.tool == "create_order"]
    payments = [k for k in keys if k.tool == "request_payment"]
    order_keys = stack.sql(f'SELECT r.key FROM "{Order._meta.db_table}" o JOIN "{RECORDS}" r ON r.id = o.record_id '
                           'WHERE r.key = ANY(%s)', [orders])
    return sorted(k for (k,) in order_keys) == sorted(orders) and len(paid(stack, payments)) == len(payments)


def killed_and_asked(stack: Stack, per_tool: int) -> dict:
    keys = keys_for(stack, "asked", per_tool)
    killed = kill_mid_call(stack, keys, "asked")
    asyncio.run(retry_all(stack, keys))
    return {"keys": len(keys), "settled": max(k.first_settled(killed) for k in keys) - killed,
            "succeeded": max(k.succeeded_at() for k in keys) - killed, "once": once_each(stack, keys),
            "problems": sum(1 for k in keys for a in k.answers if a.problem())}


def killed_and_left_alone(stack: Stack, per_tool: int) -> dict:
    keys = keys_for(stack, "alone", per_tool)
    killed = kill_mid_call(stack, keys, "alone")
    wait_until(lambda: all_final(stack, keys), 120, "the cluster to settle every key")
    settled = time.monotonic() - killed
    asyncio.run(retry_all(stack, keys))  # then each key's call: its result, and exactly once
    return {"keys": len(keys), "settled": settled, "succeeded": None, "once": once_each(stack, keys),
            "problems": sum(1 for k in keys for a in k.answers if a.problem())}


# --- fault 3: PostgreSQL restarted under agents ---------------------------------------------------------


def restarted_under_agents(stack: Stack, agents: int) -> dict:
    """Agents create orders and payments one key after another; the database stops and starts."""
    keys: list[Key] = []
    moments: dict[str, float] = {}

    async def agent(n: int, stop: asyncio.Event, client: httpx2.AsyncClient, deadline: float) -> None:
        round_ = 0
        while not stop.is_set():
            order = Key("create_order", f"restart-{n}-{round_}-order")
            keys.append(order)
            await call_until_done(client, stack.web.mcp_url, stack.token, order.tool, order.arguments, order.answers,
                                  deadline, max_pause=AGENT_MAX_PAUSE)
            # A payment is two writes: prepare_operation issues its operation id, then the payment carries it.
            prepared = Key("prepare_operation", f"restart-{n}-{round_}-prepare")
            keys.append(prepared)
            answer = await call_until_done(client, stack.web.mcp_url, stack.token, prepared.tool, prepared.arguments,
                                           prepared.answers, deadline, max_pause=AGENT_MAX_PAUSE)
            payment = Key("request_payment", answer.result["operation_id"])
            keys.append(payment)
            await call_until_done(client, stack.web.mcp_url, stack.token, payment.tool, payment.arguments,
                                  payment.answers, deadline, max_pause=AGENT_MAX_PAUSE)
            round_ += 1

    async def scenario() -> None:
        stop = asyncio.Event()
        async with httpx2.AsyncClient(timeout=30) as client:
            work = [asyncio.create_task(agent(n, stop, client, time.monotonic() + 180)) for n in range(agents)]
            await asyncio.sleep(1.5)
            moments["fault"] = time.monotonic()
            await asyncio.to_thread(stack.database.stop)
            await asyncio.sleep(OUTAGE_SECONDS)
            await asyncio.to_thread(stack.database.start)
            moments["back"] = time.monotonic()
            stop.set()
            await asyncio.gather(*work)

    asyncio.run(scenario())
    fault, back = moments["fault"], moments["back"]
    # The keys the outage touched: asked before the database was back, not done before it went.
    touched = [k for k in keys if k.answers[0].at < back and k.succeeded_at() > fault]
    return {"keys": len(touched), "settled": max(0.0, max(k.first_settled(fault) for k in touched) - back),
            "succeeded": max(k.succeeded_at() for k in touched) - fault, "once": once_each(stack, keys),
            "problems": sum(1 for k in keys for a in k.answers if a.problem())}


# --- the section ------------------------------------------------------------------------------------------


def run(quick: bool = False, root: Path | None = None) -> str:
    per_tool, agents = (2, 4) if quick else (10, 20)
    env = {"IDEMOPS_EXECUTION_LEASE_SECONDS": "2", "IDEMOPS_EXECUTION_HEARTBEAT_SECONDS": "0.5"} if quick else {}
    # Its agents are unattended scripts: no person behind them to confirm a small payment (docs/approvals.md),
    # on every web process of the stack (the victims and the one the agents call through an outage).
    env["IDEMOPS_MCP_USER_CONFIRMATION"] = "false"
    # Each victim's payments are held by the gateway under a 300 s timeout, and a SIGKILLed process's slots of the
    # downstream's in-flight limit stay leased for that timeout (tools_app.incidents.limits): the first victim's
    # would leave the second too few to send all of its payments (with 10 a tool: 6 of the default 16). The limit
    # is the default plus what both victims hold, so each fault starts with the default's slots free.
    env["IDEMOPS_DOWNSTREAM_MAX_IN_FLIGHT"] = str(conf().downstream_max_in_flight + 2 * per_tool)
    lease = float(env.get("IDEMOPS_EXECUTION_LEASE_SECONDS", conf().execution_lease_seconds))
    heartbeat = float(env.get("IDEMOPS_EXECUTION_HEARTBEAT_SECONDS", conf().execution_heartbeat_seconds))
    loop = conf().lease_sweep_seconds
    workdir = Path(tempfile.mkdtemp(prefix="idemops-settle-", dir=root))
    stack = Stack(workdir, "settle", **env)
    try:
        results = [("web process SIGKILLed mid-call; agents retry", killed_and_asked(stack, per_tool)),
                   ("web process SIGKILLed mid-call; nobody asks (the cluster alone)",
                    killed_and_left_alone(stack, per_tool)),
                   (f"PostgreSQL stopped {OUTAGE_SECONDS} s, then started; agents keep calling",
                    restarted_under_agents(stack, agents))]
    finally:
        stack.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    lines = ["## Keys settling after a fault (issue 9, part 4)", "",
             f"Write lease {lease:g} s, heartbeat every {min(heartbeat, lease / 3):.2g} s, the cluster's lease sweep "
             f"every {loop:g} s{' (quick mode)' if quick else ' (the defaults)'}; target: every key settled within "
             f"lease + 5 s = **{lease + 5:g} s**. One stack of its own (web, django-q2 cluster with 2 workers, "
             "payment gateway) on its own embedded PostgreSQL. Keys: create_order and request_payment, half each "
             "(each payment under an operation id prepare_operation issued: before the fault for the SIGKILLs, as "
             "a third key of its own under the restart). "
             "*Settled*: a call answers the key's real state (its result, or `unknown_outcome` while it is "
             "reconciled), not `in_progress`; for the cluster alone: the record is SUCCEEDED or FAILED. Agents "
             f"retry every {AGENT_MAX_PAUSE} s at most (sooner if `retry_after` says so). The downstream's in-flight "
             f"limit is {env['IDEMOPS_DOWNSTREAM_MAX_IN_FLIGHT']}: the default's plus the slots both killed victims "
             "hold for their requests' 300 s timeout.", "",
             "| Fault | keys | every key settled (s) | every key succeeded (s) | exactly once | unclassified answers |",
             "| --- | ---: | ---: | ---: | --- | ---: |"]
    for label, r in results:
        succeeded = f"{r['succeeded']:.1f}" if r["succeeded"] is not None else "—"
        lines.append(f"| {label} | {r['keys']} | {r['settled']:.1f} | {succeeded} | "
                     f"{'yes' if r['once'] else '**NO**'} | {r['problems']} |")
    lines += ["", "Times count from the SIGKILL, or (restart) from the moment the database was back for *settled* "
                  "and from the moment it stopped for *succeeded*. Killed executors' create_order keys were held "
                  "inside their transaction (nothing committed: reconciled as not done, then run by the retry); "
                  "their payments were held by the gateway, half paid (reconciled as found, replayed) and half not "
                  "(reconciled as not done, paid once by the retry).", ""]
    return "\n".join(lines)
