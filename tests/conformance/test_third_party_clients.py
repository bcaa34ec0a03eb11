"""Third-party MCP clients call the platform's plain write tools: the TypeScript SDK's own client
(tests/interop/write_client.mjs, a storm on separate connections, a conflict, a replay marker it reads) and
the MCP Inspector's CLI (lists the tools, calls one)."""

import json
import os
import subprocess

import pytest

from idemops_demo.models import Order
from tools_app.models import IdempotencyRecord

pytestmark = [pytest.mark.live, pytest.mark.conformance]

ORDER = {"customer": "ACME", "currency": "EUR", "items": [{"sku": "BOLT-1", "quantity": 3, "unit_price": "2.50"}]}
# The MCP Inspector (pinned in tests/interop/package.json, as the proxy's tests use it) in its CLI mode.
INSPECTOR = "node_modules/.bin/mcp-inspector"


def typescript(interop, url: str, token: str, scenario: str, arguments: dict) -> dict:
    done = subprocess.run(["node", "write_client.mjs", url, token, scenario, json.dumps(arguments)],
                          cwd=interop, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_typescript_client_reads_the_extension_advertised_at_initialize(interop, conformance_web, token):
    seen = typescript(interop, conformance_web.mcp_url, token, "advertisement", {})

    assert seen["advertised"]["keyMeta"] == "io.idemops/idempotency-key" and seen["advertised"]["version"]
    assert seen["declared"]["create_order"]["key"] == "required"
    assert seen["declared"]["request_payment"]["requiresOperationId"] is True
    assert "get_order" not in seen["declared"]


def test_a_storm_of_identical_typescript_calls_on_separate_connections_makes_one_order(
        interop, conformance_web, token):
    # when ten TypeScript clients, each on its own connection, send the same create_order at once
    seen = typescript(interop, conformance_web.mcp_url, token, "storm",
                      {"count": 10, "tool": "create_order", "arguments": {**ORDER, "idempotency_key": "ts-storm"}})

    # then there is one order, every client ended with it, and only one answer is not marked replayed
    finals = [answers[-1] for answers in seen["calls"]]
    assert Order.objects.count() == 1 and IdempotencyRecord.objects.filter(key="ts-storm").count() == 1
    assert {answer["structured"]["order_id"] for answer in finals} == {Order.objects.get().pk}
    assert [answer["isError"] for answer in finals] == [False] * 10
    assert sum(answer["replayed"] is False for answers in seen["calls"] for answer in answers
               if not answer["isError"]) == 1


def test_the_typescript_client_reads_the_replay_marker_and_a_conflict_naming_the_field(
        interop, conformance_web, token):
    other = {**ORDER, "items": [{**ORDER["items"][0], "quantity": 4}]}
    seen = typescript(interop, conformance_web.mcp_url, token, "sequence", {"calls": [
        {"tool": "create_order", "arguments": {**ORDER, "idempotency_key": "ts-1"}},
        {"tool": "create_order", "arguments": {**ORDER, "idempotency_key": "ts-1"}},
        {"tool": "create_order", "arguments": {**other, "idempotency_key": "ts-1"}},
    ]})

    first, again, conflicting = (answers[-1] for answers in seen["calls"])
    assert (first["replayed"], again["replayed"]) == (False, True)
    assert again["structured"] == {**first["structured"], "idempotency": {**first["structured"]["idempotency"],
                                                                          "replayed": True}}
    assert conflicting["isError"] and conflicting["structured"]["error"]["class"] == "conflict"
    assert conflicting["structured"]["error"]["differing_fields"] == ["items[0].quantity"]
    assert Order.objects.count() == 1


def test_the_inspector_cli_lists_the_tools_and_calls_one(interop, conformance_web, token):
    auth = ["--header", f"Authorization: Bearer {token}"]
    cli = [str(interop / INSPECTOR), "--cli", conformance_web.mcp_url, "--transport", "http", *auth]
    listed = subprocess.run([*cli, "--method", "tools/list"], cwd=interop, capture_output=True, text=True,
                            timeout=120, env={**os.environ, "CI": "true"})
    called = subprocess.run([*cli, "--method", "tools/call", "--tool-name", "create_ticket", "--tool-arg",
                             "subject=Berth", "body=Aurora docks at berth 7", "idempotency_key=inspector-1"],
                            cwd=interop, capture_output=True, text=True, timeout=120, env={**os.environ, "CI": "true"})

    assert listed.returncode == 0, listed.stderr[-3000:]
    tools = {tool["name"]: tool for tool in json.loads(listed.stdout)["tools"]}
    assert tools["create_ticket"]["_meta"]["io.idemops/idempotency"]["key"] == "required"
    assert called.returncode == 0, called.stderr[-3000:]
    answer = json.loads(called.stdout)
    assert answer["structuredContent"]["subject"] == "Berth" and answer["_meta"]["io.idemops/replayed"] is False
    assert IdempotencyRecord.objects.filter(key="inspector-1").count() == 1
