"""Issue 36: a downstream outage ends by itself, and what it leaves for a person.

The incident of tests/support/incident.py on a stack of its own (web, a django-q2 cluster, the demo payment
gateway, on an embedded PostgreSQL of its own): ten agents keep paying while the gateway answers 503
"nothing done" for 10 minutes (quick: 10 s), then commits without answering for 30 s (quick: 5 s),
then recovers. Figures: duplicate payments, records left for a person, how long after the recovery
the last key completed, and how many retries the open breaker held back without running.
Alone: `.venv/bin/python bench/run.py incident`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from bench.common import Section
from tests.support import incident
from tools_app.conf import conf


def run(quick: bool = False, root: Path | None = None) -> Section:
    outage, hang = (10.0, 5.0) if quick else (600.0, 30.0)
    workdir = Path(tempfile.mkdtemp(prefix="idemops-incident-", dir=root))
    stack = incident.stack(workdir)
    try:
        report = incident.run(stack, before=5, outage=outage, hang=hang)
    finally:
        stack.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    calls = sum(len(p.answers) for p in report.payments)
    c = conf()
    markdown = f"""## A downstream outage, from the agents' side (issue 36)

{os.cpu_count()} cores; the documented defaults (breaker: {c.breaker_failures} failures in
{c.breaker_window_seconds:g} s, a probe every {c.breaker_open_seconds:g} s; retry window {c.retry_window_seconds:g} s;
the gateway's timeout 5 s). {incident.AGENTS} agents pay 12.00 EUR each under an issued
operation id, following every answer; the gateway answers 503 "nothing done" for **{outage:g} s**, then
commits without answering for {hang:g} s, then recovers. New payments stop at the recovery.

| figure | value |
| --- | ---: |
| payments started by the agents | {len(report.payments)} |
| payments made by the gateway | {report.gateway_payments} |
| operations paid more than once | {report.duplicate_operations} |
| records left for a person (escalated) | {report.escalated} |
| records UNKNOWN at the end / closed as not_executed | {report.unknown_left} / {report.not_executed} |
| keys unfinished | {len(report.unfinished)} |
| last key completed after the recovery | {report.slowest_after_recovery:.1f} s |
| the agents' calls / `POST /payments` the gateway received | {calls} / {report.gateway_posts} |
| answers held back without running (breaker open, in-flight limit) | {report.held_answers} |
| `unknown_outcome` answers heard | {report.unknown_answers} |
"""
    return Section(markdown)
