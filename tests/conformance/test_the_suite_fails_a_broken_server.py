"""The extension's suite can fail: against conformance/broken_server.py (the bare mcp SDK claiming the
extension) each defect is caught by the scenarios docs/extension/idempotency.md section 12 names, and the
same server without the defect passes them. (idemops passing every scenario: test_idempotency_suite.py.)"""

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from tests.support.processes import ROOT, Service, free_port

pytestmark = [pytest.mark.conformance]

SLOW = ["--slow-tool", "ingest_document", "--slow-arguments", json.dumps({"text": "# Berths\n\nbody"})]
# The scenarios the bare server can be checked on (it prepares no expired key and has no high-risk tool).
CHECKED = {"advertised", "storm", "replay", "conflict", "invalid-key", "in-progress", "lost-answer", "broken-stream"}
# Which scenarios catch which defect, at 2025-11-25 (the table of docs/extension/idempotency.md section 12).
CAUGHT_BY = {
    "double-write": {"storm"},
    "no-replay-marker": {"storm", "replay", "lost-answer"},
    "conflict-without-fields": {"conflict"},
    "in-progress-without-handle": {"in-progress"},
}


class BrokenServer(Service):
    def __init__(self, *defects: str):
        self.defects = defects
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        argv = [sys.executable, "-m", "conformance.broken_server", "--port", str(self.port)]
        super().__init__(f"broken-server-{self.port}", argv + [arg for d in defects for arg in ("--defect", d)],
                         env=dict(os.environ))
        deadline = time.monotonic() + 90  # a bound on start-up, not a pace
        while time.monotonic() < deadline and self.process.poll() is None:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=2).close()
                return
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"the broken server did not start: {self.log_tail()}")


def run_suite(url: str, protocol: str) -> dict[str, dict]:
    done = subprocess.run([sys.executable, "-m", "conformance", "--url", url, "--json", "--protocol", protocol,
                           *SLOW], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.stderr == "", done.stderr[-3000:]
    return {check["name"]: check for check in json.loads(done.stdout)}


def failed(checks: dict[str, dict]) -> set[str]:
    return {name for name, check in checks.items() if check["status"] == "fail"}


@pytest.fixture
def broken_server(request):
    server = BrokenServer(*request.param)
    yield server
    server.stop()


@pytest.mark.parametrize("broken_server", [("none",)], indirect=True)
@pytest.mark.parametrize("protocol", ["2025-11-25", "2026-07-28"])
def test_the_bare_server_without_its_defects_passes_every_scenario_it_can_be_checked_on(broken_server, protocol):
    checks = run_suite(broken_server.url, protocol)

    passed = {name for name, check in checks.items() if check["status"] == "pass"}
    assert passed == CHECKED - ({"broken-stream"} if protocol == "2025-11-25" else set()), checks


@pytest.mark.parametrize("broken_server", [(defect,) for defect in CAUGHT_BY], indirect=True,
                         ids=list(CAUGHT_BY))
def test_each_defect_alone_fails_exactly_the_scenarios_that_catch_it(broken_server):
    (defect,) = broken_server.defects

    checks = run_suite(broken_server.url, "2025-11-25")

    assert failed(checks) == CAUGHT_BY[defect], checks
    assert {name for name, check in checks.items() if check["status"] == "pass"} == (
        CHECKED - CAUGHT_BY[defect] - {"broken-stream"}), checks


@pytest.mark.parametrize("broken_server", [()], indirect=True, ids=["all-defects"])
def test_with_every_defect_the_storm_replay_conflict_in_progress_and_lost_answer_fail_at_2026_07_28(broken_server):
    # At 2026-07-28 there are no sessions, so the per-session double write cannot show: the storm fails on
    # its unmarked replays instead, and says so.
    checks = run_suite(broken_server.url, "2026-07-28")

    assert failed(checks) == {"storm", "replay", "conflict", "in-progress", "lost-answer"}, checks
    assert "not marked replayed" in checks["storm"]["saw"]
    assert "differing_fields []" in checks["conflict"]["saw"]
    assert checks["in-progress"]["saw"] == "handles {} / {}"
