"""Issue 13: task status pushed to MCP clients. A markdown section for `make bench` (docs/benchmarks.md).

1. What the change notice adds to a task transition: `core.db.transition` on a task row with and without
   `notify` (the pg_notify in the same statement).
2. Push latency: from a transition committed in this process (as a worker would) to the
   `notifications/tasks` frame arriving at a client that listens to the task (2026-07-28
   `subscriptions/listen`) through a real uvicorn web process, whose fallback re-read is set to ten
   minutes: every push is woken by the notice. Without notices a client would see the change at the
   next poll: `IDEMOPS_TASK_WATCH_POLL_SECONDS` (default 5 s) for a waiting request, the client's own
   poll interval otherwise.

Run alone with `.venv/bin/python bench/run.py task_push`; `run(quick=True)` does fewer rounds.
"""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
import uuid

import httpx2
from django.contrib.auth import get_user_model
from django.utils import timezone
from mcp import Client
from mcp.client.extension import ClientExtension, NotificationBinding
from mcp.client.streamable_http import streamable_http_client
from mcp_types import SubscriptionsListenResult

from tests.support.mcp_client import Listen, ListenParams, TaskPush
from tests.support.processes import WebServer
from tools_app import access, tasks
from tools_app.core import db
from tools_app.models import Task
from tools_app.toolkit.calls import Caller, call_tool
from tools_app.toolkit.registry import get_tool

RUN = uuid.uuid4().hex[:8]


def _task(caller: Caller, key: str) -> Task:
    result = call_tool(get_tool("start_task"), caller, {"tool": "ingest_document", "arguments": {"text": "bench"},
                                                        "idempotency_key": f"{RUN}-{key}"})
    return Task.objects.get(pk=result.result["task_id"])


def transition_cost(task: Task, rounds: int) -> dict[str, float]:
    """Median microseconds of one guarded transition of a task row (+ its audit event), per variant."""
    times: dict[str, list[float]] = {"without notify": [], "with notify": []}
    for _ in range(rounds):
        for name, channel in (("without notify", None), ("with notify", tasks.CHANGES_CHANNEL)):
            started = time.perf_counter()
            db.transition(task, {"version": task.version}, {"version": task.version + 1, "updated_at": timezone.now()},
                          action="bench.tick", actor="bench", notify=channel)
            times[name].append((time.perf_counter() - started) * 1e6)
    return {name: statistics.median(values) for name, values in times.items()}


# --- a listening 2026-07-28 client ------------------------------------------------------------------------


class _Listener(ClientExtension):
    identifier = "io.modelcontextprotocol/tasks"

    def __init__(self):
        self.arrivals: list[tuple[float, str]] = []

    def notifications(self):
        return [NotificationBinding(method="notifications/tasks", params_type=TaskPush, handler=self.on_push)]

    async def on_push(self, params: TaskPush) -> None:
        self.arrivals.append((time.perf_counter(), params.status))


def _listen(url: str, token: str, task_id: str, listener: _Listener) -> None:
    async def main():
        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=600) as http:
            async with Client(streamable_http_client(url, http_client=http), mode="2026-07-28",
                              extensions=[listener]) as client:
                await client.session.send_request(Listen(params=ListenParams(notifications={"taskIds": [task_id]})),
                                                  SubscriptionsListenResult, request_read_timeout_seconds=600)
                await asyncio.sleep(0.5)  # bound notifications drain through their own queue

    asyncio.run(main())


def push_latency(caller: Caller, token: str, rounds: int) -> list[float]:
    """Milliseconds from a committed transition to its push at a listening client, per transition."""
    web = WebServer(name="bench-push-web", IDEMOPS_TASK_WATCH_POLL_SECONDS="600")
    try:
        task = _task(caller, "push")
        agent = access.Agent(caller.tenant_id, caller.actor)
        listener = _Listener()
        thread = threading.Thread(target=_listen, args=(web.mcp_url, token, str(task.pk), listener), daemon=True)
        thread.start()
        _wait(lambda: listener.arrivals, "the first push")
        committed = []
        for n in range(rounds):
            seen = len(listener.arrivals)
            before = time.perf_counter()
            if n % 2 == 0:
                tasks.pause(task, agent, reason="bench")
            else:
                tasks.resume(task, agent)
            committed.append(before)  # the transition's statement commits before the call returns
            _wait(lambda seen=seen: len(listener.arrivals) > seen, "a push")
            time.sleep(0.05)
        tasks.cancel(task, agent)
        thread.join(timeout=30)
        arrivals = [at for at, _ in listener.arrivals[1:rounds + 1]]
        return [(arrived - sent) * 1000 for sent, arrived in zip(committed, arrivals, strict=True)]
    finally:
        web.stop()


def _wait(condition, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} within {timeout}s")
        time.sleep(0.002)


def run(quick: bool = False) -> str:
    tenant = access.create_tenant(f"push-{RUN}", "Push bench")
    owner, _ = get_user_model().objects.get_or_create(username="bench-owner")
    _, token = access.issue_token(tenant, "bench", owner=owner)
    caller = Caller(tenant_id=tenant.pk, actor="agent:bench")
    rounds = (100, 10) if quick else (1000, 60)
    cost = transition_cost(_task(caller, "cost"), rounds[0])
    latencies = sorted(push_latency(caller, token, rounds[1]))
    p95 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.95))]
    return "\n".join([
        "## Task status pushes (issue 13)", "",
        "A task transition notifies its id (pg_notify in the transition's own statement); each web process "
        "listens and wakes the requests waiting on that task.", "",
        "| Guarded task transition + audit event | median µs |", "| --- | --- |",
        *(f"| {name} | {value:,.0f} |" for name, value in cost.items()),
        "", f"({rounds[0]} transitions each, alternating, one connection, this process.)", "",
        "| Push latency: transition committed here → `notifications/tasks` at a listening client | ms |",
        "| --- | --- |",
        f"| median | {statistics.median(latencies):.1f} |", f"| p95 | {p95:.1f} |",
        "| without notices (the fallback re-read, `IDEMOPS_TASK_WATCH_POLL_SECONDS` default) | 5,000 at worst |",
        "", f"({len(latencies)} transitions (pause, resume, …) of one task; the web server is a uvicorn process "
        "on the same machine, its fallback re-read set to 600 s, so each push was woken by the notice.)", "",
    ])
