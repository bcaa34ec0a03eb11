"""What one change gains in the task runner: two checkouts side by side on one database.

    .venv/bin/python bench/ab_tasks.py /path/to/checkout-before [--rounds 3] [--tasks 30]

Runs, from the checkout given (before) and from this one (after), alternating in rounds, the same
measurement in a process of each checkout's code: P6b's synthetic pipeline (10 steps that do no
work, `bench.bench_tasks.SYNTHETIC`) run by `tasks.jobs.run_task` in that process, `--tasks` times
after a warm-up, and the anchor of P6b (one single-row UPDATE with its commit). Prints each side's
median milliseconds per task and per step (a task's tenth: its fixed costs, the take, the first
step's start and the end, included), and a step in anchors, round by round. Both checkouts must share the
schema (no migration between them).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import before_and_after, fresh_database_url  # noqa: E402

# What each side runs, in its own checkout: only names both sides have.
MEASURE = """
import json, statistics, sys, time, uuid
from bench.common import setup_django
setup_django()
from bench import bench_tasks as bt
from tools_app import access
from tools_app.models import TenantLimits
from tools_app.tasks import jobs
from tools_app.toolkit.calls import Caller
count = int(sys.argv[1])
tenant = access.create_tenant(f"ab-tasks-{uuid.uuid4().hex[:6]}")
TenantLimits.objects.create(tenant=tenant, concurrent_tasks_per_agent=0)
caller = Caller(tenant_id=tenant.pk, actor="agent:ab-tasks/bench")
anchor = bt.one_update_commit_ms(bt.new_task(caller, "bench_synthetic", {"size": 1}, uuid.uuid4().hex))
def one():
    task = bt.new_task(caller, "bench_synthetic", {"size": 200}, uuid.uuid4().hex)
    started = time.perf_counter()
    assert jobs.run_task(str(task.pk)) == "succeeded"
    return time.perf_counter() - started
for _ in range(5):
    one()
print(json.dumps({"anchor_ms": anchor, "task_ms": statistics.median(one() for _ in range(count)) * 1000}))
"""


def main() -> None:
    args = before_and_after(__doc__, tasks=(int, 30))
    env = {**os.environ, "DATABASE_URL": os.environ.get("DATABASE_URL") or fresh_database_url(),
           "IDEMOPS_LOG_LEVEL": "WARNING"}
    sides = {"before": args.before.resolve(), "after": ROOT}
    results: dict[str, list[dict[str, float]]] = {name: [] for name in sides}
    print("| round | side | ms a task | ms a step | anchor ms | a step, in anchors |")
    print("| ---: | --- | ---: | ---: | ---: | ---: |")
    for round_number in range(1, args.rounds + 1):
        for name, checkout in sides.items():
            done = subprocess.run([sys.executable, "-c", MEASURE, str(args.tasks)], cwd=checkout, env=env,
                                  capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise SystemExit(f"{name} ({checkout}) failed:\n{done.stderr[-3000:]}")
            figures = json.loads(done.stdout.strip().splitlines()[-1])
            results[name].append(figures)
            step = figures["task_ms"] / 10
            print(f"| {round_number} | {name} | {figures['task_ms']:.1f} | {step:.2f} | {figures['anchor_ms']:.2f} | "
                  f"{step / figures['anchor_ms']:.1f} |", flush=True)
    before, after = (statistics.median(r["task_ms"] for r in results[n]) for n in ("before", "after"))
    print(f"\nmedian ms a task: before {before:.1f}, after {after:.1f} ({before / after:.2f}× faster)")


if __name__ == "__main__":
    main()
