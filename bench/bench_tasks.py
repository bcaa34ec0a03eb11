"""Issue 4: long tasks. A markdown section for `make bench` (docs/benchmarks.md).

1. Per-step checkpoint overhead: the same pipeline run by the task runner
   (lease, step history, checkpoint and audit per step) and as plain calls.
2. Tasks per second through django-q2: tiny ingest_document tasks (six
   steps each) vs a bare django-q2 job, on the same two-worker cluster.
3. Time from a worker's SIGKILL to resumed progress on another worker.

Worker processes are real `manage.py qcluster` clusters on the benchmark
database. Run alone with `.venv/bin/python bench/run.py tasks`.
"""

from __future__ import annotations

import base64
import os
import statistics
import time
import uuid
from pathlib import Path

from django.db import connection
from django_q.models import OrmQ
from django_q.models import Success as QSuccess
from django_q.tasks import async_task
from pydantic import BaseModel

from bench.common import ROOT
from idemops.conf import override_conf
from tests.documents_fixtures import long_text, pdf_of_text
from tools_app import access, tasks
from tools_app.models import StepRun, Task, TaskStatus, TenantLimits
from tools_app.tasks import jobs as task_jobs
from tools_app.toolkit.calls import Caller, call_tool
from tools_app.toolkit.pipelines import Pipeline, Step, StepContext, task_tool
from tools_app.toolkit.registry import WriteInput, get_tool
from tools_app.tools.documents import INGEST

ROUNDS = 7
THROUGHPUT_JOBS = 200
KILLS = 3
RUN = uuid.uuid4().hex[:8]  # keys of this run never meet an earlier run's
LEASE = 2.0
WORKER_ENV = {"IDEMOPS_TASK_LEASE_SECONDS": str(LEASE), "IDEMOPS_TASK_HEARTBEAT_SECONDS": "0.3",
              "IDEMOPS_Q_WORKERS": "2"}


# --- a synthetic pipeline, for the fixed cost of a step -------------------------------------------


class BenchInput(WriteInput):
    size: int = 200


class BenchOutput(BaseModel):
    steps: int


def _step(number: int):
    def run(ctx: StepContext) -> dict:
        return {"step": number, "pad": "x" * ctx.arguments.size}
    return run


SYNTHETIC_STEPS = 10
SYNTHETIC = Pipeline(steps=tuple(Step(f"s{n}", _step(n)) for n in range(SYNTHETIC_STEPS - 1))
                     + (Step("last", lambda ctx: {"steps": SYNTHETIC_STEPS}),))
task_tool(name="bench_synthetic", title="bench", description="bench", input_model=BenchInput,
          output_model=BenchOutput, pipeline=SYNTHETIC)


class PlainContext(StepContext):
    """What a step sees when called directly: no lease, no progress writes."""

    def __init__(self, task, arguments, outputs):
        super().__init__(task=task, arguments=arguments, outputs=outputs, progress=lambda *a: None,
                         check=lambda: None)


def run_plain(task: Task, pipeline: Pipeline) -> None:
    spec = get_tool(task.tool)
    arguments = spec.input_model.model_validate({**task.arguments, "idempotency_key": "plain"})
    outputs: dict = {}
    for step in pipeline.steps:
        outputs[step.name] = step.run(PlainContext(task, arguments, outputs))


def new_task(caller: Caller, tool: str, arguments: dict, key: str) -> Task:
    result = call_tool(get_tool("start_task"), caller, {"tool": tool, "arguments": arguments,
                                                         "idempotency_key": f"{RUN}-{key}"})
    assert result.error is None, result.error
    return Task.objects.get(pk=result.result["task_id"])


def one_update_commit_ms(task: Task, count: int = 200) -> float:
    """The anchor: one single-row UPDATE in its own transaction (what every write here is made of)."""
    timings = []
    for _ in range(count):
        started = time.perf_counter()
        Task.objects.filter(pk=task.pk).update(progress_message="anchor")
        timings.append(time.perf_counter() - started)
    return statistics.median(timings) * 1000


def checkpoint_overhead(caller: Caller, rounds: int) -> tuple[float, list[str]]:
    last_job = OrmQ.objects.order_by("-id").values_list("id", flat=True).first() or 0
    anchor_ms = one_update_commit_ms(new_task(caller, "bench_synthetic", {"size": 1}, "anchor"))
    rows = []
    cases = [
        ("synthetic, 10 steps, 200 B outputs", "bench_synthetic", {"size": 200}, SYNTHETIC),
        ("synthetic, 10 steps, 64 KB outputs (artifacts)", "bench_synthetic", {"size": 65536}, SYNTHETIC),
        ("ingest_document, 6 steps, 20 KB Markdown", "ingest_document", {"text": "# Bench\n\n" + long_text(20_000)},
         INGEST),
        ("ingest_document, 6 steps, 300 KB PDF", "ingest_document",
         {"content_base64": base64.b64encode(pdf_of_text(long_text(300_000))).decode()}, INGEST),
    ]
    for case, (label, tool, arguments, pipeline) in enumerate(cases):
        plain, runner = [], []
        for n in range(rounds):
            task = new_task(caller, tool, arguments, f"plain-{case}-{n}")
            tasks.take(str(task.pk), "bench-plain")  # its queued job must not run it meanwhile
            started = time.perf_counter()
            run_plain(task, pipeline)
            plain.append(time.perf_counter() - started)
            task = new_task(caller, tool, arguments, f"runner-{case}-{n}")
            started = time.perf_counter()
            assert task_jobs.run_task(str(task.pk)) == "succeeded"
            runner.append(time.perf_counter() - started)
        steps = len(pipeline.steps)
        p, r = statistics.median(plain) * 1000, statistics.median(runner) * 1000
        per_step = (r - p) / steps
        # The synthetic steps do no work: their ratio would only measure nothing.
        ratio = f"{r / p:.2f}×" if pipeline is INGEST else "—"
        rows.append(f"| {label} | {p:.1f} | {r:.1f} | {per_step:.2f} | {per_step / anchor_ms:.1f} | {ratio} |")
    # The jobs start_task queued: the runner ran their tasks in-process already.
    OrmQ.objects.filter(id__gt=last_job).delete()
    return anchor_ms, rows


# --- throughput through django-q2 -------------------------------------------------------------------


def drain(condition, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("the cluster did not finish in time")
        time.sleep(0.05)


def throughput(caller: Caller, count: int) -> list[str]:
    from tests.processes import Worker

    cluster = Worker(name="bench-throughput", **WORKER_ENV)
    try:
        group = f"bench-bare-{RUN}"
        started = time.perf_counter()
        for _ in range(count):
            async_task("math.sqrt", 4.0, group=group)
        drain(lambda: QSuccess.objects.filter(group=group).count() >= count)
        bare = count / (time.perf_counter() - started)

        started = time.perf_counter()
        ids = [new_task(caller, "ingest_document", {"text": f"Note {n}. The dock opens at six."}, f"tp-{n}").pk
               for n in range(count)]
        submitted = time.perf_counter() - started
        drain(lambda: Task.objects.filter(pk__in=ids, status=TaskStatus.SUCCEEDED).count() >= count)
        ours = count / (time.perf_counter() - started)
    finally:
        cluster.stop(grace=3)
    return [f"| bare django-q2 job (`math.sqrt`) | {count} | {bare:.1f} | 1.00× |",
            f"| ingest_document task, 6 steps (start_task → succeeded) | {count} | {ours:.1f} | "
            f"{ours / bare:.2f}× |",
            f"| (start_task calls alone, in one thread) | {count} | {count / submitted:.1f} | |"]


# --- recovery after SIGKILL --------------------------------------------------------------------------


def recovery(caller: Caller, doc_dir: Path, rounds: int) -> list[str]:
    from django.conf import settings

    path = doc_dir / "bench-recovery.pdf"
    path.write_bytes(pdf_of_text(long_text(1_500_000)))
    override_conf(settings, document_allowed_dirs=[str(doc_dir)])
    env = {**WORKER_ENV, "IDEMOPS_Q_WORKERS": "1", "IDEMOPS_DOCUMENT_ALLOWED_DIRS": str(doc_dir)}
    return [recover_once(caller, path, env, n) for n in range(rounds)]


def recover_once(caller: Caller, path: Path, env: dict[str, str], n: int) -> str:
    from tests.processes import Worker

    def current() -> Task:
        return Task.objects.get(pk=task.pk)

    first = Worker(name=f"bench-recovery-a{n}", **env)
    task = new_task(caller, "ingest_document", {"path": str(path)}, f"recovery-{n}")
    drain(lambda: StepRun.objects.filter(task=task).exists(), timeout=120)
    standby = Worker(name=f"bench-recovery-b{n}", **env)
    drain(lambda: current().current_step == "extract_text" and (current().progress_done or 0) >= 10, timeout=120)
    lease_left = current().lease_expires_at.timestamp() - time.time()
    killed_at = time.time()
    first.kill()
    before = StepRun.objects.filter(task=task).count()
    # The sweep as an operator's loop or a frequent schedule would run it: every 0.5 s.
    while StepRun.objects.filter(task=task).count() == before:
        tasks.sweep()
        time.sleep(0.5)
    resumed = StepRun.objects.filter(task=task).latest("started_at").started_at.timestamp()
    drain(lambda: (current().progress_done or 0) > 0, timeout=120)
    progressed = time.time()
    expired = tasks_lease_expired_at(task)
    tasks.cancel(current(), access.Agent(current().tenant_id, "bench"))
    standby.stop(grace=3)
    first.stop(grace=0)
    return (f"| {n + 1} | {lease_left:.2f} | {expired - killed_at:.2f} | {resumed - killed_at:.2f} | "
            f"{progressed - killed_at:.2f} |")


def tasks_lease_expired_at(task: Task) -> float:
    from tools_app.models import AuditEvent

    event = AuditEvent.objects.filter(object_id=str(task.pk), action="task.lease_expired").latest("id")
    return event.created_at.timestamp()


# --- the run -----------------------------------------------------------------------------------------


def run() -> str:
    tenant = access.create_tenant("bench-tasks")
    # Hundreds of tasks at once from one agent: past the default limit of unfinished tasks per agent.
    TenantLimits.objects.create(tenant=tenant, concurrent_tasks_per_agent=0)
    caller = Caller(tenant_id=tenant.pk, actor="agent:bench-tasks/bench")
    doc_dir = ROOT / "var" / "bench-docs"
    doc_dir.mkdir(parents=True, exist_ok=True)
    anchor_ms, overhead = checkpoint_overhead(caller, ROUNDS)
    rates = throughput(caller, THROUGHPUT_JOBS)
    recovered = recovery(caller, doc_dir, KILLS)
    return f"""## Long tasks (issue 4)

{os.cpu_count()} cores, PostgreSQL {connection.pg_version // 10000}; medians of {ROUNDS} rounds.

### Per-step checkpoint overhead (in-process, one thread)

The same pipeline run as plain calls of its step functions, and by the task
runner: lease take, and per step one transaction (task UPDATE, checkpoint
upsert, StepRun close and open, audit event), and the final succeed. Anchor:
one single-row UPDATE with its commit takes {anchor_ms:.2f} ms here; the
overhead is also given in those units.

| pipeline | plain ms | runner ms | overhead ms/step | overhead in anchors | ratio |
| --- | ---: | ---: | ---: | ---: | ---: |
{chr(10).join(overhead)}

### Throughput through django-q2 (2 workers, ORM broker)

| job | count | per second | ratio |
| --- | ---: | ---: | ---: |
{chr(10).join(rates)}

### From SIGKILL to resumed progress

Lease {LEASE:.0f} s, heartbeat 0.3 s, a standby worker, the sweep every 0.5 s.
Times in seconds after the kill.

| round | lease left at kill | lease expired (sweep) | step restarted | progress reported |
| ---: | ---: | ---: | ---: | ---: |
{chr(10).join(recovered)}
"""
