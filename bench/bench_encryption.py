"""P19: what encrypting personal values costs `create_order` over /mcp (issue 41).

Two idemops web processes on the same database, one storing personal values encrypted (the default: an
AES-GCM envelope per personal value under a data key of the key store, tools_app/core/personal.py), the
other with IDEMOPS_ENCRYPT_PERSONAL_VALUES off (in clear, the comparison only). One load generator measures
them in interleaved rounds (each round in the other order than the last), 1 and 8 clients, each call a new
key (a first execution: the claim and the result are both encrypted).

- P19: calls/s in clear ÷ calls/s encrypted (the higher of 1 and 8 clients): ≤ 1.1× is an overhead of at
  most 10%.
"""

from __future__ import annotations

import statistics

from bench.bench_mcp import agent_token, measure, served
from bench.common import Section, at_most, live_statistics

CONCURRENCY = (1, 8)


def run(quick: bool = False) -> Section:
    rounds, seconds = (1, 1.0) if quick else (5, 5.0)
    token = agent_token("enc")
    with served() as serve:
        encrypted = serve("idemops.asgi:application")
        clear = serve("idemops.asgi:application", env={"IDEMOPS_ENCRYPT_PERSONAL_VALUES": "0"})
        cases = {"encrypted": encrypted, "in clear": clear}
        for server in cases.values():  # connections, the data key, prepared statements
            measure(server.mcp_url, token, "create_order", 4, 0.5)
        live_statistics()
        runs: dict[tuple[str, int], list[float]] = {}
        for round_number in range(rounds):
            # Each round measures the two servers in the other order than the last: neither is always
            # the one measured second, right after the other warmed the machine (and the load generator).
            order = list(cases.items())[::1 if round_number % 2 == 0 else -1]
            for concurrency in CONCURRENCY:
                for label, server in order:
                    measured = measure(server.mcp_url, token, "create_order", concurrency, seconds)
                    runs.setdefault((label, concurrency), []).append(measured["per_s"])
    ratios = {c: [clear_ / enc for clear_, enc in zip(runs[("in clear", c)], runs[("encrypted", c)], strict=True)]
              for c in CONCURRENCY}
    worst = max(CONCURRENCY, key=lambda c: statistics.median(ratios[c]))
    p19 = at_most("P19", "`create_order` over `/mcp`: calls/s in clear ÷ encrypted (personal values), 1 and 8 "
                  "clients (the higher)", ratios[worst], 1.1, clients=worst,
                  per_s={f"{label}, {c} clients": round(statistics.median(values), 1)
                         for (label, c), values in runs.items()})
    lines = ["## Encryption of personal values (P19)", "", "| clients | in clear, calls/s | encrypted, calls/s | "
             "ratio |", "|---|---|---|---|"]
    for c in CONCURRENCY:
        lines.append(f"| {c} | {statistics.median(runs[('in clear', c)]):.1f} | "
                     f"{statistics.median(runs[('encrypted', c)]):.1f} | {statistics.median(ratios[c]):.3f}× |")
    return Section("\n".join([*lines, "", f"P19: {p19.cell()}", ""]), [p19])
