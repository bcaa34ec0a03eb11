"""One process's death stops nothing else: under a real `manage.py serve` (on an embedded PostgreSQL
of its own), the job cluster, its sentinel, a worker, the web server and the PostgreSQL server are
SIGKILLed one at a time; each time /mcp answers again (within seconds when measured: the test prints how
soon, and waits for it up to a ceiling a busy CI machine stays under), and no key is lost. A process that
keeps dying stops everything."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from pathlib import Path

import httpx2
import pytest

from tests.deploy.test_serve import alive, children
from tests.support.agents import call_tool_sync
from tests.support.processes import LOG_DIR, DatabaseServer, Service, free_port
from tests.support.task_stack import wait_until
from tools_app.management.supervisor import Child, KeepsDying, Supervisor

pytestmark = pytest.mark.live

ORDER = {"customer": "ACME", "items": [{"sku": "BOLT-1", "quantity": 1, "unit_price": "4.00"}], "currency": "EUR"}
# A ceiling, not a pace: each was back within a few seconds when measured; how soon is printed, not asserted
# (speed belongs to bench/), so that a busy CI machine cannot turn this red.
BACK_CEILING_SECONDS = 180


def serve_env(var: Path, **extra: str) -> dict[str, str]:
    """`serve` on an embedded PostgreSQL of its own (in `var`/pg): killing that server disturbs no other test."""
    env = {name: value for name, value in os.environ.items()
           if name not in ("DATABASE_URL", "IDEMOPS_EMBEDDED_DATABASE", "IDEMOPS_PGDATA")}
    return {**env, "DJANGO_SETTINGS_MODULE": "idemops.settings", "IDEMOPS_VAR_DIR": str(var),
            "IDEMOPS_PGDATA": str(var / "pg"), "IDEMOPS_RUN_DEMO_DOWNSTREAMS": "false", "IDEMOPS_Q_WORKERS": "2",
            "IDEMOPS_LOG_LEVEL": "INFO", **extra}


def the_cluster(serve: int) -> int:
    [cluster] = [pid for pid, argv in children(serve).items() if argv.endswith("-m idemops qcluster ")]
    return cluster


def the_sentinel(serve: int) -> int:
    [sentinel] = children(the_cluster(serve))
    return sentinel


def a_worker(serve: int) -> int:
    # django-q2's sentinel starts its workers first, then its monitor and pusher.
    return min(children(the_sentinel(serve)))


def the_web_server(serve: int) -> int:
    [web] = [pid for pid, argv in children(serve).items() if "granian" in argv]
    return web


def the_postgres_server(var: Path) -> int:
    return int((var / "pg" / "postmaster.pid").read_text().split()[0])


def test_serve_restarts_each_process_killed_and_mcp_answers_again_with_no_key_lost(tmp_path):
    # given `serve` with the demo (its tenant and agent token), on an embedded PostgreSQL of its own
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    (LOG_DIR / "serve-survives.log").unlink(missing_ok=True)  # only this run's lines
    serve = Service("serve-survives", [sys.executable, "manage.py", "serve", "--port", str(port)],
                    serve_env(tmp_path))
    database = None
    try:
        serve.wait_http(f"{base}/readyz", timeout=240)
        token = json.loads((tmp_path / "demo-credentials.json").read_text())["token"]
        database = DatabaseServer(tmp_path / "pg")
        answered: dict[str, int] = {}  # key -> the order id the agent was told

        def order(key: str) -> int | None:
            answer = call_tool_sync(f"{base}/mcp", token, "create_order", {**ORDER, "idempotency_key": key})
            return answer.result["order_id"] if answer.succeeded else None

        answered["before"] = order("before")
        faults = [("the job cluster", "jobs", the_cluster), ("its sentinel", "jobs", the_sentinel),
                  ("a worker", None, a_worker), ("the web server", "web", the_web_server),
                  ("the postgres server", "postgres", lambda serve_pid: the_postgres_server(tmp_path))]
        took: dict[str, float] = {}
        for what, restarted, find in faults:
            wait_until(lambda: all_running(serve.process.pid), timeout=BACK_CEILING_SECONDS, what="every process")
            victim = find(serve.process.pid)

            # when one process is SIGKILLed
            os.kill(victim, signal.SIGKILL)
            killed_at = time.monotonic()

            # then /mcp answers again (the agent retrying its key until it is answered)
            key = "after-" + what.replace(" ", "-")
            answered[key] = wait_until(lambda key=key: order(key), timeout=BACK_CEILING_SECONDS,
                                        what=f"/mcp to answer after {what} was killed")
            took[what] = time.monotonic() - killed_at
            # and what was killed runs again (a worker is its sentinel's to replace, not serve's)
            wait_until(lambda find=find, victim=victim: alive_other(find, serve.process.pid, victim),
                       timeout=BACK_CEILING_SECONDS, what=f"a new {what}")
            if restarted is not None:
                wait_until(lambda restarted=restarted: f"process {restarted} started again" in serve.log_path.read_text(
                    errors="replace"), what=f"serve's log line for {restarted}")
            assert serve.process.poll() is None, serve.log_tail()

        # and no key was lost: each replays the order it was told, and each made exactly one order
        for key, order_id in answered.items():
            again = call_tool_sync(f"{base}/mcp", token, "create_order", {**ORDER, "idempotency_key": key})
            assert again.succeeded and again.result["idempotency"]["replayed"] is True, again.body
            assert again.result["order_id"] == order_id
        assert sorted(database.sql("SELECT id FROM idemops_demo_order")) == sorted((i,) for i in answered.values())

        def logged() -> dict[str, int]:
            log = serve.log_path.read_text(errors="replace")
            return {name: len(re.findall(rf"process {name} .*; restarting it in", log)) for name in ("jobs", "web",
                                                                                                   "postgres")}

        # and each restart was counted, by process, with its line in serve's log (the cluster may die
        # once more on its own while PostgreSQL is away: django-q2's sentinel writes its heartbeat to
        # the database cache; a PostgreSQL still recovering may refuse the first try)
        restarts = wait_until(lambda: (counted := restarts_counted(base)) == logged() and counted,
                              what="the restarts in /metrics, as logged")
        assert restarts["jobs"] >= 2 and restarts["web"] >= 1 and restarts["postgres"] >= 1, restarts
        print("back within (s):", {what: round(seconds, 1) for what, seconds in took.items()})
    finally:
        serve.stop(grace=30)
        if database is not None:
            database.stop()  # serve stops it; after a failure, it may not have


def all_running(serve_pid: int) -> bool:
    """The cluster's sentinel has its two workers, monitor and pusher, and granian its worker."""
    try:
        return len(children(the_sentinel(serve_pid))) == 4 and len(children(the_web_server(serve_pid))) == 1
    except ValueError:
        return False  # one of them is still starting


def alive_other(find, serve_pid: int, victim: int) -> bool:
    try:
        pid = find(serve_pid)
    except (ValueError, OSError):
        return False  # not started yet (or still starting its children)
    return pid != victim and alive(pid)


def restarts_counted(base: str) -> dict[str, int] | None:
    """process -> restarts, from /metrics, once all four are there (counts are flushed about every second)."""
    text = httpx2.get(f"{base}/metrics", timeout=10).text
    counted = {line.split('process="')[1].split('"')[0]: int(float(line.rsplit(" ", 1)[1]))
               for line in text.splitlines() if line.startswith("idemops_process_restarts_total{")}
    return counted if {"jobs", "web", "postgres"} <= set(counted) and sum(counted.values()) >= 4 else None


def test_a_process_that_keeps_dying_stops_the_supervisor_after_its_restart_limit():
    # given a process that dies as soon as it starts, allowed 3 deaths in a minute
    restarts: list[str] = []
    child = Child("broken", [sys.executable, "-c", "raise SystemExit(3)"])
    supervisor = Supervisor([child], limit=3, window=60, on_restart=restarts.append)
    child.start()
    started = time.monotonic()

    # when it is watched
    with pytest.raises(KeepsDying, match="process broken .*exited with code 3; it died 4 times in 60s"):
        supervisor.watch()

    # then it was restarted 3 times, backing off (0.25-0.5 s, then 0.5-1 s, then 1-2 s) before giving up
    assert restarts == ["broken"] * 3
    assert time.monotonic() - started >= 0.25 + 0.5 + 1


def test_a_killed_child_and_what_it_left_in_its_session_are_replaced_by_a_new_one():
    # given a child that started a grandchild in its session (as granian starts its workers)
    child = Child("parent", [sys.executable, "-c", (
        "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
        "time.sleep(600)")])
    supervisor = Supervisor([child], limit=3, window=60, on_restart=lambda name: None)
    child.start()
    first = child.process
    try:
        wait_until(lambda: children(first.pid), what="the grandchild")
        [grandchild] = children(first.pid)

        # when the child is SIGKILLed
        os.kill(first.pid, signal.SIGKILL)
        wait_until(lambda: supervisor.check() or child.process is not first, timeout=60, what="a new child")

        # then the grandchild it left went with it, and a new child runs
        assert not alive(grandchild)
        assert child.process.poll() is None
    finally:
        for process in (first, child.process):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
