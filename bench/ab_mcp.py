"""What one change gains on /mcp: idemops from two checkouts side by side, against the floor.

    .venv/bin/python bench/ab_mcp.py /path/to/checkout-before [--rounds 3] [--seconds 4] [--tool whoami]

Serves idemops (granian, one worker) from the checkout given (before) and from this one (after),
and the floor (bench/floor_mcp.py), all on one fresh benchmark database, and measures `create_order`
with 1 and 32 clients in interleaved rounds (bench.bench_mcp.measure). Prints each side's calls/s,
its ratio to the floor of the same round, and its 32-client / 1-client ratio: the lever's gain in
P10 and P11 terms, under one load. With `--tool whoami`, `whoami` against the bare SDK's no-op
(bench/bare_mcp.py) instead: P4b's terms. Both checkouts must share the schema (no migration between them).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import before_and_after, setup_django, spread  # noqa: E402


def main() -> None:
    args = before_and_after(__doc__, seconds=(float, 4.0), tool=(str, "create_order"))
    anchor, anchor_app, anchor_tool = ("floor", "bench.floor_mcp:app", "create_order") \
        if args.tool == "create_order" else ("bare SDK", "bench.bare_mcp:app", "noop")
    setup_django()

    from bench.bench_mcp import Server, agent_token, measure
    from tests.support.processes import free_port

    class Checkout(Server):
        """idemops served from another directory (its code, this virtualenv and database)."""

        def __init__(self, cwd: Path) -> None:
            self.port = free_port()
            self.base = f"http://127.0.0.1:{self.port}"
            log_dir = ROOT / "var" / "bench-logs"
            log_dir.mkdir(parents=True, exist_ok=True)
            self.log = open(log_dir / f"ab-{cwd.name}.log", "wb")
            self.process = subprocess.Popen(
                [str(Path(sys.executable).parent / "granian"), "--interface", "asgi", "--host", "127.0.0.1",
                 "--port", str(self.port), "--workers", "1", "--log-level", "warning", "idemops.asgi:application"],
                cwd=cwd, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
                env={**os.environ, "IDEMOPS_LOG_LEVEL": "WARNING", "IDEMOPS_PUBLIC_URL": self.base})
            self._wait()

    token = agent_token("ab")
    servers: dict[str, tuple[Server, str | None]] = {}
    rates: dict[tuple[str, int], list[float]] = {}
    try:
        servers[anchor] = (Server(anchor_app), None)
        servers["before"] = (Checkout(args.before.resolve()), token)
        servers["after"] = (Checkout(ROOT), token)
        def tool(name: str) -> str:
            return anchor_tool if name == anchor else args.tool

        for name, (server, key) in servers.items():
            measure(server.mcp_url, key, tool(name), 4, 0.5)
        for number in range(args.rounds):
            for clients in (1, 32):
                for name, (server, key) in servers.items():
                    rates.setdefault((name, clients), []).append(
                        measure(server.mcp_url, key, tool(name), clients, args.seconds)["per_s"])
            print(f"round {number + 1}: load average {os.getloadavg()[0]:.1f}", flush=True)
    finally:
        for server, _ in servers.values():
            server.stop()
    for clients in (1, 32):
        for name in ("before", "after"):
            ratios = [ours / floor for ours, floor in zip(rates[(name, clients)], rates[(anchor, clients)],
                                                          strict=True)]
            print(f"{clients:2} client(s), {name:6}: {statistics.median(rates[(name, clients)]):6.0f} calls/s, "
                  f"{statistics.median(ratios):.2f}× the {anchor} "
                  f"({spread(ratios, '')})")
    for name in servers:
        scaling = [many / one for one, many in zip(rates[(name, 1)], rates[(name, 32)], strict=True)]
        print(f"{name:8} 32 clients / 1: {statistics.median(scaling):.2f}× ({spread(scaling, '')})")
    print(f"load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
