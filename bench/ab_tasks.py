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

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import before_and_after, in_both_checkouts, print_gain  # noqa: E402

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

    def cells(figures: dict[str, float]) -> list[str]:
        step = figures["task_ms"] / 10
        return [f"{figures['task_ms']:.1f}", f"{step:.2f}", f"{figures['anchor_ms']:.2f}",
                f"{step / figures['anchor_ms']:.1f}"]

    results = in_both_checkouts(args, MEASURE, args.tasks,
                                ["ms a task", "ms a step", "anchor ms", "a step, in anchors"], cells)
    print_gain(results, "task_ms", "ms a task", 1)


if __name__ == "__main__":
    main()
