"""The CLI: `python -m conformance --url URL --token TOKEN [--protocol 2025-11-25|2026-07-28] ...`.

Prints one line per scenario (PASS / FAIL / SKIP, the specification's section, what it saw), like the
official MCP conformance suite, then a summary; `--json` prints the checks as one JSON list instead.
Exits 1 when a scenario fails.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from dataclasses import asdict

from conformance.scenarios import SCENARIOS, Options, run
from conformance.wire import LEGACY, MODERN


def options(argv: list[str] | None = None) -> tuple[Options, argparse.Namespace]:
    parser = argparse.ArgumentParser(prog="python -m conformance", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True, help="the server's Streamable HTTP endpoint")
    parser.add_argument("--token", help="bearer token sent as Authorization")
    parser.add_argument("--protocol", choices=[LEGACY, MODERN], default=LEGACY)
    parser.add_argument("--tool", default="create_order", help="a write tool that takes a key")
    parser.add_argument("--arguments", type=json.loads, help="its arguments (JSON object, without the key)")
    parser.add_argument("--conflict-arguments", type=json.loads, help="other arguments for the conflict scenario")
    parser.add_argument("--storm", type=int, default=8, help="concurrent calls in the storm")
    parser.add_argument("--slow-tool", help="a tool still running when called twice (in-progress)")
    parser.add_argument("--slow-arguments", type=json.loads, default={})
    parser.add_argument("--high-risk-tool", default="request_payment", help="'' to skip")
    parser.add_argument("--high-risk-arguments", type=json.loads)
    parser.add_argument("--expired-key", help="a key the server holds past its retention (retention scenario)")
    parser.add_argument("--expired-tool", help="the tool of --expired-key (default: --tool)")
    parser.add_argument("--expired-arguments", type=json.loads, help="its arguments (default: --arguments)")
    parser.add_argument("--scenario", action="append", choices=sorted(SCENARIOS), help="run only these")
    parser.add_argument("--json", action="store_true", help="print the checks as JSON")
    args = parser.parse_args(argv)
    o = Options(url=args.url, token=args.token, version=args.protocol, tool=args.tool, storm=args.storm,
                conflict_arguments=args.conflict_arguments, slow_tool=args.slow_tool,
                slow_arguments=args.slow_arguments, high_risk_tool=args.high_risk_tool or None,
                expired_key=args.expired_key, expired_tool=args.expired_tool,
                expired_arguments=args.expired_arguments)
    if args.arguments is not None:
        o.arguments = args.arguments
    if args.high_risk_arguments is not None:
        o.high_risk_arguments = args.high_risk_arguments
    return o, args


def main(argv: list[str] | None = None) -> int:
    o, args = options(argv)
    checks = asyncio.run(run(o, args.scenario))
    if args.json:
        print(json.dumps([asdict(check) for check in checks]))
    else:
        for check in checks:
            print(f"{check.status.upper():4}  {check.name:14} §{check.section:8} {check.saw}")
        counts = {status: sum(c.status == status for c in checks) for status in ("pass", "fail", "skip")}
        print(f"\n{o.url} at {o.version}: {counts['pass']} passed, {counts['fail']} failed, {counts['skip']} skipped")
    return 1 if any(check.status == "fail" for check in checks) else 0


if __name__ == "__main__":
    sys.exit(main())
