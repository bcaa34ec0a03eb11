"""What one change gains in a `create_order` call over /mcp, without HTTP: two checkouts side by side.

    .venv/bin/python bench/ab_drive_mcp.py /path/to/checkout-before [--rounds 3] [--requests 600]

Runs, from the checkout given (before) and from this one (after), alternating in rounds, the same
measurement in a process of each checkout's code: `--requests` `tools/call` requests of idemops'
`create_order` (a new key each, the order of bench/bench_mcp.py) sent straight to the ASGI app as
`bench/drive_mcp.py` does (its lifespan runs, no sockets, no load generator), after a warm-up and
ANALYZE. Prints each side's CPU time a request (the process's: the event loop's thread and the
database threads) and wall time a request, round by round: P10's one-client cell without the HTTP
server and the load generator around it. Both checkouts must share the schema (no migration between
them).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import before_and_after, in_both_checkouts, print_gain  # noqa: E402

# What each side runs, in its own checkout: only names both sides have.
MEASURE = """
import asyncio, json, logging, sys, time, uuid
from bench.common import live_statistics, setup_django
logging.disable(logging.INFO)
setup_django()
import idemops.asgi
from bench.bench_mcp import ORDER, agent_token
from bench.drive_mcp import call, started
count = int(sys.argv[1])
async def requests(app, token, n):
    for _ in range(n):
        await call(app, token, "create_order", {**ORDER, "idempotency_key": uuid.uuid4().hex})
async def main(token):
    app = idemops.asgi.application
    stop = await started(app)
    await requests(app, token, 300)
    await asyncio.to_thread(live_statistics)
    await requests(app, token, 100)
    cpu, wall = time.process_time(), time.perf_counter()
    await requests(app, token, count)
    figures = {"cpu_us": (time.process_time() - cpu) / count * 1e6,
               "wall_us": (time.perf_counter() - wall) / count * 1e6}
    await stop.put({"type": "lifespan.shutdown"})
    return figures
print(json.dumps(asyncio.run(main(agent_token("ab-drive")))))
"""


def main() -> None:
    args = before_and_after(__doc__, requests=(int, 600))

    def cells(figures: dict[str, float]) -> list[str]:
        return [f"{figures['cpu_us']:.0f}", f"{figures['wall_us']:.0f}"]

    results = in_both_checkouts(args, MEASURE, args.requests, ["CPU µs a request", "wall µs a request"], cells)
    print_gain(results, "cpu_us", "CPU µs a request", 0)
    print_gain(results, "wall_us", "wall µs a request", 0)


if __name__ == "__main__":
    main()
