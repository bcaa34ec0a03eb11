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

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import before_and_after, in_both_checkouts, print_gain  # noqa: E402

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
    figures = (("first_ms", "ms a first call"), ("first_cpu_ms", "CPU ms a first call"), ("replay_ms", "ms a replay"))
    results = in_both_checkouts(args, MEASURE, args.calls, [what for _, what in figures],
                                lambda measured: [f"{measured[name]:.3f}" for name, _ in figures])
    for name, what in figures:
        print_gain(results, name, what, 3)


if __name__ == "__main__":
    main()
