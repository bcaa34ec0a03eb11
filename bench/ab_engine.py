"""What one change gains in the engine: two checkouts side by side on one database (P1, P2).

    .venv/bin/python bench/ab_engine.py /path/to/checkout-before [--rounds 3] [--calls 400]

Runs, from the checkout given (before) and from this one (after), alternating in rounds, the same
measurement in a process of each checkout's code: `--calls` first calls of a local tool through
`engine.run` (its claim, a no-op effect, its completion: P1's engine side), then a replay of each
(P2's), after a warm-up and ANALYZE as `bench/bench_engine.py` does. Prints each side's median
milliseconds a first call and a replay, and its CPU time a first call (the process's, round trips
excluded), round by round. Both checkouts must share the schema (no migration between them).
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
from bench.common import live_statistics, setup_django
setup_django()
from tools_app import access, engine
count = int(sys.argv[1])
tenant = access.create_tenant(f"ab-engine-{uuid.uuid4().hex[:6]}")
def operation(key):
    return engine.Operation(tenant_id=tenant.pk, tool="bench", key=key, actor="agent:ab-engine/bench",
                            arguments={"customer": "ACME", "items": [{"sku": "A", "quantity": 1}]})
def effect(record):
    return {"ok": True}
def timed(keys):
    times, cpu = [], time.process_time()
    for key in keys:
        started = time.perf_counter()
        engine.run(operation(key), effect)
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000, (time.process_time() - cpu) / len(keys) * 1000
warm = [uuid.uuid4().hex for _ in range(100)]
timed(warm); timed(warm)
live_statistics()
keys = [uuid.uuid4().hex for _ in range(count)]
first_ms, first_cpu_ms = timed(keys)
replay_ms, _ = timed(keys)
print(json.dumps({"first_ms": first_ms, "first_cpu_ms": first_cpu_ms, "replay_ms": replay_ms}))
"""


def main() -> None:
    args = before_and_after(__doc__, calls=(int, 400))
    env = {**os.environ, "DATABASE_URL": os.environ.get("DATABASE_URL") or fresh_database_url(),
           "IDEMOPS_LOG_LEVEL": "WARNING"}
    sides = {"before": args.before.resolve(), "after": ROOT}
    results: dict[str, list[dict[str, float]]] = {name: [] for name in sides}
    print("| round | side | ms a first call | CPU ms a first call | ms a replay |")
    print("| ---: | --- | ---: | ---: | ---: |")
    for round_number in range(1, args.rounds + 1):
        for name, checkout in sides.items():
            done = subprocess.run([sys.executable, "-c", MEASURE, str(args.calls)], cwd=checkout, env=env,
                                  capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise SystemExit(f"{name} ({checkout}) failed:\n{done.stderr[-3000:]}")
            figures = json.loads(done.stdout.strip().splitlines()[-1])
            results[name].append(figures)
            print(f"| {round_number} | {name} | {figures['first_ms']:.3f} | {figures['first_cpu_ms']:.3f} | "
                  f"{figures['replay_ms']:.3f} |", flush=True)
    for figure, what in (("first_ms", "ms a first call"), ("first_cpu_ms", "CPU ms a first call"),
                         ("replay_ms", "ms a replay")):
        before, after = (statistics.median(r[figure] for r in results[n]) for n in ("before", "after"))
        print(f"median {what}: before {before:.3f}, after {after:.3f} ({before / after:.2f}× faster)")


if __name__ == "__main__":
    main()
