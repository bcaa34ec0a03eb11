"""What the live task tests run against: a document server that fails on purpose,
the environment for web and worker processes, and polling helpers.

The document server is a real HTTP server (a thread of the test process): for
each path it answers a scripted list of statuses, then keeps answering the
last one, and counts the requests.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.support.processes import free_port


class DocServer:
    def __init__(self):
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/docs/"
        self.routes: dict[str, tuple[list[int], bytes]] = {}
        self.hits: dict[str, int] = defaultdict(int)
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                statuses, body = server.routes.get(self.path, ([404], b""))
                index = server.hits[self.path]
                server.hits[self.path] += 1
                status = statuses[min(index, len(statuses) - 1)]
                payload = body if status == 200 else b"unavailable"
                self.send_response(status)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def serve(self, name: str, body: bytes, statuses: list[int] | None = None) -> str:
        """Serve `body` at /docs/<name> after answering `statuses` first; returns the URL."""
        self.routes[f"/docs/{name}"] = ([*(statuses or []), 200], body)
        return self.base_url + name

    def fail(self, name: str, status: int) -> str:
        self.routes[f"/docs/{name}"] = ([status], b"")
        return self.base_url + name

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def stack_env(doc_dir: Path, doc_server: DocServer, **overrides: str) -> dict[str, str]:
    """Short leases and backoffs, so crashes and retries play out in seconds."""
    return {
        "IDEMOPS_TASK_LEASE_SECONDS": "2",
        "IDEMOPS_TASK_HEARTBEAT_SECONDS": "0.3",
        "IDEMOPS_TASK_BACKOFF_BASE_SECONDS": "0.4",
        "IDEMOPS_TASK_CALL_WAIT_SECONDS": "1",
        "IDEMOPS_DOCUMENT_ALLOWED_DIRS": str(doc_dir),
        "IDEMOPS_DOCUMENT_ALLOWED_URL_PREFIXES": doc_server.base_url,
        "IDEMOPS_Q_WORKERS": "2",
        **overrides,
    }


def wait_until(condition: Callable[[], object], timeout: float = 60, what: str = "condition") -> object:
    """Poll until `condition()` is truthy; return its value."""
    deadline = time.monotonic() + timeout
    pause = 0.02
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(pause)
        pause = min(pause * 2, 0.25)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def swept_until(task, *statuses: str) -> bool:
    """Run the task sweep (as its schedule would: a dead worker's expired lease hands the task to the
    living workers), then whether the task reached one of `statuses`."""
    from tools_app.tasks import jobs

    jobs.sweep()
    task.refresh_from_db()
    return task.status in statuses


# --- module-scoped fixtures (import them into a test module to use them) -----------------------


@pytest.fixture(scope="module")
def doc_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("docs")


@pytest.fixture(scope="module")
def doc_server():
    server = DocServer()
    yield server
    server.close()


def live_stack(env: str, name: str) -> tuple[Callable[..., object], Callable[..., object]]:
    """Two module-scoped fixtures started with the environment the fixture named `env` returns: a
    uvicorn web server (`web-<name>`) and a django-q2 cluster (`workers-<name>`). In a test module:
    `web, workers = live_stack("my_env", "mine")`."""
    from tests.support.processes import WebServer, Worker

    @pytest.fixture(scope="module")
    def web(django_db_setup, django_db_blocker, request):
        with django_db_blocker.unblock():
            server = WebServer(name=f"web-{name}", **request.getfixturevalue(env))
        yield server
        server.stop()

    @pytest.fixture(scope="module")
    def workers(django_db_setup, django_db_blocker, request):
        with django_db_blocker.unblock():
            cluster = Worker(name=f"workers-{name}", **request.getfixturevalue(env))
        yield cluster
        cluster.stop(grace=3)

    return web, workers


@pytest.fixture(scope="module")
def task_env(doc_dir, doc_server):
    return stack_env(doc_dir, doc_server)


# uvicorn with the documents allow-lists, and a django-q2 cluster of two workers, for a module.
task_web, task_workers = live_stack("task_env", "tasks")


@pytest.fixture
def settle_tasks(transactional_db):
    """Before the test database is flushed: cancel what still runs and wait for the workers to let go.

    (A worker writing while the flush truncates its tables deadlocks the flush.)
    """
    yield
    from django_q.models import OrmQ

    from tools_app import tasks
    from tools_app.access import Agent
    from tools_app.core.errors import AlreadyDone, Transient
    from tools_app.models import StepRun, Task

    def cancelled(task) -> bool:
        try:
            tasks.cancel(task, Agent(task.tenant_id, "test:teardown"))
        except AlreadyDone:
            pass  # it finished meanwhile
        except Transient:
            return False  # a worker moved it on at every try (fast steps): try again, as the error says
        return True

    for task in Task.objects.filter(status__in=tasks.ACTIVE):
        wait_until(lambda task=task: cancelled(task), timeout=30, what=f"task {task.pk} to be cancelled")
    wait_until(lambda: not OrmQ.objects.exists() and not StepRun.objects.filter(finished_at=None).exists(),
               timeout=120, what="the workers to finish their jobs")


# --- a lost job: the cluster holding a queued task's job is SIGKILLed ----------------------------


def lost_job(caller, long_pdf: Path, env: dict[str, str], name: str, key: str) -> tuple[object, float, object]:
    """Cause a lost job, as an operator saw it: cluster A's only worker is busy with a long task, so
    A's pusher takes the next task's job and holds it in memory; A is SIGKILLed with it. A standby
    cluster B (two workers) was frozen (SIGSTOP) meanwhile, so that A, not B, takes that job; it
    runs again from the moment of the kill.

    Returns (the task whose job was lost, seconds from the kill to a worker taking it by the
    database's clock, the task that kept A busy). Both clusters are stopped on return."""
    import os
    import signal

    from django.utils import timezone
    from django_q.models import OrmQ

    from tests.support.processes import Worker
    from tools_app.core import clock
    from tools_app.models import AuditEvent, Task, TaskStatus
    from tools_app.toolkit.calls import call_tool
    from tools_app.toolkit.registry import get_tool

    def start(arguments: dict, suffix: str) -> Task:
        result = call_tool(get_tool("start_task"), caller, {"tool": "ingest_document", "arguments": arguments,
                                                            "idempotency_key": f"{key}-{suffix}"})
        assert result.error is None, result.error
        return Task.objects.get(pk=result.result["task_id"])

    def refreshed(task: Task) -> Task:
        task.refresh_from_db()
        return task

    clusters: list[Worker] = []
    try:
        standby = Worker(name=f"{name}-b", **{**env, "IDEMOPS_Q_WORKERS": "2"})
        clusters.append(standby)
        os.killpg(standby.process.pid, signal.SIGSTOP)
        holder = Worker(name=f"{name}-a", **{**env, "IDEMOPS_Q_WORKERS": "1"})
        clusters.append(holder)
        busy = start({"path": str(long_pdf)}, "busy")
        wait_until(lambda: refreshed(busy).current_step == "extract_text" and (busy.progress_done or 0) >= 1,
                   timeout=120, what="cluster A's worker to be busy extracting the long PDF")
        queued = start({"text": "# Queued\n\nIt waits behind the long one."}, "queued")
        wait_until(lambda: [job for job in OrmQ.objects.filter(lock__gt=timezone.now())
                            if job.name() == f"task-{queued.pk}"], timeout=30, what="cluster A to take its job")
        holder.kill()
        killed_at = clock.read()
        os.killpg(standby.process.pid, signal.SIGCONT)
        wait_until(lambda: refreshed(queued).status == TaskStatus.SUCCEEDED, timeout=120,
                   what="the task whose job was lost to succeed on cluster B")
        taken = AuditEvent.objects.filter(object_id=str(queued.pk), action="task.taken").latest("id").created_at
        return queued, (taken - killed_at).total_seconds(), busy
    finally:
        for cluster in reversed(clusters):
            if cluster.process.poll() is None:
                os.killpg(cluster.process.pid, signal.SIGCONT)
            cluster.stop(grace=3)
