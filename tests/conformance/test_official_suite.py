"""The official MCP conformance suite (@modelcontextprotocol/conformance, pinned in tests/interop) against the
platform: every server scenario of the suite is run, or left out with its reason.

The suite's tool scenarios call test-only tools by fixed names (`test_simple_text`, `test_error_handling`,
...): the platform serves them with IDEMOPS_CONFORMANCE_TEST_TOOLS on (tools_app/mcp/conformance_tools.py;
production refuses the setting), as the `official_web` server of conftest.py runs.

On Node 20 the suite's dist imports `globSync` from `fs` (Node 22 has it): `node --import
./node20_fs_glob.mjs` gives the suite's own `fs` imports a module that adds the `glob` package's
globSync, and touches nothing else.
"""

import asyncio
import json
import re
import subprocess

import pytest

from tests.support.mcp_client import connect, raw_call
from tools_app.mcp.conformance_tools import NAMES

pytestmark = [pytest.mark.live, pytest.mark.conformance]

SUITE = ["node", "--import", "./node20_fs_glob.mjs", "node_modules/@modelcontextprotocol/conformance/dist/index.js"]

PASSING = ["server-initialize", "ping", "tools-list", "resources-list", "prompts-list", "dns-rebinding-protection",
           # with the test-only tools (and their logging/setLevel handler)
           "tools-call-simple-text", "tools-call-image", "tools-call-audio", "tools-call-embedded-resource",
           "tools-call-mixed-content", "tools-call-with-logging", "tools-call-error", "tools-call-with-progress",
           "json-schema-2020-12", "logging-set-level"]
# Scenarios about resumable SSE streams on a session: the platform serves /mcp stateless (any web process
# answers any request), so it gives no session id and no event ids. They run to the end with warnings on
# those SHOULDs (priming event, retry field) and no failure.
STATELESS = ["server-sse-polling", "server-sse-multiple-streams"]
# Scenarios whose test tool asks the client something in the middle of the call (a server-initiated request,
# at 2025-11-25): the client answers on a new POST, which a stateless server cannot route back to the
# waiting call (another process may serve it). The SDK refuses to send the request, and the scenario fails.
NO_BACK_CHANNEL = "Cannot send '{}': this transport context has no back-channel for server-initiated requests"
FAILING = {
    "tools-call-sampling": NO_BACK_CHANNEL.format("sampling/createMessage"),
    "tools-call-elicitation": NO_BACK_CHANNEL.format("elicitation/create"),
    "elicitation-sep1034-defaults": NO_BACK_CHANNEL.format("elicitation/create"),
    "elicitation-sep1330-enums": NO_BACK_CHANNEL.format("elicitation/create"),
}
LEFT_OUT = {
    "completion-complete": "the platform declares no `completions` capability (it has no prompts or templates)",
    "resources-read-text": "reads test:// resources; the platform serves no resources",
    "resources-read-binary": "reads test:// resources; the platform serves no resources",
    "resources-templates-read": "reads a test:// resource template; the platform serves none",
    "resources-subscribe": "subscribes to a test:// resource; the platform serves no resources",
    "resources-unsubscribe": "unsubscribes from a test:// resource; the platform serves no resources",
    "prompts-get-simple": "gets a test prompt; the platform serves no prompts",
    "prompts-get-with-args": "gets a test prompt; the platform serves no prompts",
    "prompts-get-embedded-resource": "gets a test prompt; the platform serves no prompts",
    "prompts-get-with-image": "gets a test prompt; the platform serves no prompts",
}


def run_scenario(interop, url: str, scenario: str, output) -> list[dict]:
    done = subprocess.run([*SUITE, "server", "--url", url, "--scenario", scenario, "--suite", "all",
                           "-o", str(output)], cwd=interop, capture_output=True, text=True, timeout=300)
    results = list(output.glob(f"server-{scenario}-*/checks.json"))
    assert len(results) == 1, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(results[0].read_text())


def test_every_server_scenario_of_the_suite_is_run_or_left_out_with_its_reason(interop):
    listed = subprocess.run([*SUITE, "list"], cwd=interop, capture_output=True, text=True, timeout=120, check=True)
    server_part = listed.stdout.split("Client scenarios")[0]
    scenarios = re.findall(r"^\s+- (\S+) \[", server_part, flags=re.MULTILINE)

    assert len(scenarios) == 32
    assert sorted(scenarios) == sorted([*PASSING, *STATELESS, *FAILING, *LEFT_OUT])


@pytest.mark.parametrize("scenario", PASSING)
def test_the_platform_passes_the_official_scenario(interop, bearer_proxy, tmp_path, scenario):
    checks = run_scenario(interop, bearer_proxy, scenario, tmp_path)

    statuses = {check["id"]: check["status"] for check in checks}
    assert "SUCCESS" in statuses.values() and set(statuses.values()) <= {"SUCCESS", "INFO"}, checks


@pytest.mark.parametrize("scenario", STATELESS)
def test_a_stateless_server_runs_the_sse_stream_scenario_with_warnings_only(interop, bearer_proxy, tmp_path, scenario):
    checks = run_scenario(interop, bearer_proxy, scenario, tmp_path)

    statuses = {check["id"]: check["status"] for check in checks}
    assert "FAILURE" not in statuses.values(), checks
    assert statuses[f"{scenario}-session"] == "WARNING"  # no session id: the server is stateless


@pytest.mark.parametrize("scenario", FAILING)
def test_a_stateless_server_fails_the_scenario_whose_tool_asks_the_client_mid_call(
        interop, bearer_proxy, tmp_path, scenario):
    checks = run_scenario(interop, bearer_proxy, scenario, tmp_path)

    failures = [check for check in checks if check["status"] == "FAILURE"]
    assert len(failures) == 1 and FAILING[scenario] in failures[0]["errorMessage"], checks


def served(url: str, token: str) -> tuple[set[str], object]:
    async def ask():
        async with connect(url, token) as client:
            return {tool.name for tool in (await client.list_tools()).tools}, client.server_capabilities.logging
    return asyncio.run(ask())


def test_the_test_only_tools_are_served_only_with_their_setting_on(conformance_web, official_web, token):
    # given the platform without the setting (as in production, which refuses it) and with it
    plain_tools, plain_logging = served(conformance_web.mcp_url, token)
    test_tools, test_logging = served(official_web.mcp_url, token)

    # then only the server with the setting lists the suite's tools and declares logging
    assert len(NAMES) == 13 and not NAMES & plain_tools and plain_logging is None
    assert test_tools == plain_tools | NAMES and test_logging is not None
    # and without it, calling one is an unknown tool
    answer = raw_call(conformance_web.mcp_url, token, "test_error_handling", {})
    assert answer["error"]["code"] == -32602 and answer["error"]["message"] == "Unknown tool: test_error_handling"
