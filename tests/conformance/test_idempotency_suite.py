"""The platform passes the idempotency extension's own conformance suite (conformance/), at both protocol
revisions: the suite runs as its own process, as anyone checking their server would run it, and the
test counts what it left in the database."""

import json
import subprocess
import sys
from datetime import timedelta

import pytest
from django.utils import timezone

from idemops_demo.models import Order
from tests.support.mcp_client import call_sync
from tests.support.processes import ROOT
from tools_app.models import IdempotencyRecord

# No workers run here: the in-progress scenario's ingest_document task stays queued until the flush.
pytestmark = [pytest.mark.live, pytest.mark.conformance]

ORDER = {"customer": "ACME", "currency": "EUR", "items": [{"sku": "BOLT-1", "quantity": 3, "unit_price": "2.50"}]}


def run_suite(url: str, token: str, *options: str) -> list[dict]:
    done = subprocess.run([sys.executable, "-m", "conformance", "--url", url, "--token", token, "--json", *options],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.stderr == "", done.stderr[-3000:]
    return json.loads(done.stdout)


def expired_order_key(url: str, token: str) -> str:
    """An order whose key is past its retention: time passes by moving the record's times in the database."""
    first = call_sync(url, token, "create_order", {**ORDER, "idempotency_key": "expired-1"})
    assert not first.is_error, first.structured_content
    then = timezone.now() - timedelta(days=2)
    assert IdempotencyRecord.objects.filter(key="expired-1").update(finished_at=then, expires_at=then) == 1
    return "expired-1"


@pytest.mark.parametrize("protocol", ["2025-11-25", "2026-07-28"])
def test_the_platform_passes_every_scenario_of_its_own_suite_at_both_protocol_revisions(
        conformance_web, token, protocol):
    # given an order whose key expired
    expired = expired_order_key(conformance_web.mcp_url, token)

    # when the suite runs against the platform (ingest_document is a tool still running when called twice)
    checks = run_suite(conformance_web.mcp_url, token, "--protocol", protocol, "--expired-key", expired,
                       "--slow-tool", "ingest_document", "--slow-arguments", json.dumps({"text": "# Berths\n\nbody"}))

    # then every scenario passes, except the broken stream before 2026-07-28, skipped with its reason
    by_name = {check["name"]: check for check in checks}
    expected_skips = {"broken-stream"} if protocol == "2025-11-25" else set()
    assert {name for name, check in by_name.items() if check["status"] != "pass"} == expected_skips, checks
    assert len(by_name) == 10
    # and each scenario's key made one order: the storm, the replay, the conflict, the valid key after the
    # invalid ones, the lost answer, (the broken streams,) the expired key's new operation, and the first one
    assert Order.objects.count() == 7 + (protocol == "2026-07-28"), checks


def test_a_tool_that_takes_no_key_fails_the_advertisement_check_and_nothing_else_runs(conformance_web, token):
    # when the suite checks a tool that exists but takes no key (a read)
    checks = run_suite(conformance_web.mcp_url, token, "--tool", "whoami", "--arguments", "{}")

    # then it fails at once, saying what it saw
    assert [(c["name"], c["status"]) for c in checks] == [("advertised", "fail")]
    assert "whoami declares no key" in checks[0]["saw"]
