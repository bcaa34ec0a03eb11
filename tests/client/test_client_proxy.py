"""The proxy for MCP hosts (issue 25 §1, §5), driven by real hosts' clients: the Python SDK's stdio
client and the MCP Inspector CLI, each launching `python -m idemops_client proxy` as a host would.
Orders are counted in the database; requests between proxy and server by the fault proxy."""

import asyncio
import json
import os
import sqlite3
import stat
import subprocess
import sys
import tomllib
import uuid
from pathlib import Path

import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from opentelemetry import trace

from idemops_client.faults import FaultProxy
from idemops_client.ledger import Ledger, LedgerError
from idemops_client.oauth import token_path
from idemops_client.proxy import package_version
from idemops_demo.models import Order
from tests.support.oauth_flow import console
from tests.support.operators import make_operator
from tests.support.processes import ROOT, free_port
from tools_app.access.roles import OPERATOR
from tools_app.models import AgentConnection, IdempotencyRecord, Tenant

ORDER = {"customer": "ACME", "currency": "EUR", "items": [{"sku": "BOLT-1", "quantity": 3, "unit_price": "2.50"}]}
CLIENT_VERSION = tomllib.loads((ROOT / "idemops_client" / "pyproject.toml").read_text())["project"]["version"]
INSPECTOR = ROOT / "tests" / "interop" / "node_modules" / ".bin" / "mcp-inspector"


def proxy_command(url: str, ledger: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "idemops_client", "proxy", "--url", url, "--ledger", str(ledger),
            "--session", "host-1", "--max-seconds", "20", *extra]


def host(url: str, token: str, ledger: Path) -> Client:
    command = proxy_command(url, ledger)
    return Client(StdioServerParameters(command=command[0], args=command[1:], cwd=ROOT,
                                        env={"IDEMOPS_TOKEN": token}))


@pytest.mark.live
def test_a_host_calling_create_order_twice_without_a_key_makes_one_order(web_server, token, tmp_path):
    async def scenario():
        async with host(web_server.mcp_url, token, tmp_path / "ledger.sqlite") as client:
            tools = await client.list_tools()
            first = await client.call_tool("create_order", ORDER)
            second = await client.call_tool("create_order", ORDER)
            resource = await client.read_resource("idemops://ledger")
            prompt = await client.get_prompt("idemops-ledger")
            return client.server_info, tools, first, second, resource, prompt

    server_info, tools, first, second, resource, prompt = asyncio.run(scenario())

    order = Order.objects.get()
    names = {tool.name for tool in tools.tools}
    assert {"create_order", "get_order", "prepare_operation"} <= names
    assert server_info is not None and server_info.version == package_version() == CLIENT_VERSION
    assert not first.is_error and first.structured_content["order_id"] == order.pk
    assert first.structured_content["idempotency"]["replayed"] is False
    assert second.structured_content["order_id"] == order.pk and (second.meta or {})["io.idemops/from-ledger"]
    # One truth about the replay: _meta, the structured content and the text the model reads agree.
    assert second.meta["io.idemops/replayed"] is True and second.structured_content["idempotency"]["replayed"] is True
    assert json.loads(second.content[1].text)["idempotency"]["replayed"] is True
    assert "already done" in second.content[0].text
    report = resource.contents[0].text
    assert "## Done (1)" in report and f"order {order.pk}" in report and "## Waiting for a person (0)" in report
    assert f"order {order.pk}" in prompt.messages[0].content.text


@pytest.mark.live
def test_a_host_that_re_plans_with_a_fresh_invented_key_each_time_makes_one_order(web_server, token, tmp_path):
    """A model that fills a required idempotency_key makes one up at every re-plan: the proxy shows write tools
    without it and derives the key, so the re-plans are one operation; a key the host sends in _meta wins."""
    async def scenario():
        async with host(web_server.mcp_url, token, tmp_path / "ledger.sqlite") as client:
            tools = await client.list_tools()
            replans = [await client.call_tool("create_order", {**ORDER, "idempotency_key": f"model-{uuid.uuid4()}"})
                       for _ in range(3)]
            chosen = await client.call_tool("create_order", ORDER, meta={"io.idemops/idempotency-key": "host-1"})
            return tools, replans, chosen

    tools, replans, chosen = asyncio.run(scenario())

    listed = {tool.name: tool for tool in tools.tools}
    for name in ("create_order", "request_payment", "prepare_operation"):
        schema = listed[name].input_schema
        assert "idempotency_key" not in schema["properties"] and "idempotency_key" not in schema.get("required", [])
    assert "idempotency_key" in listed["get_operation"].input_schema["properties"]  # a read's look-up field stays
    assert [answer.is_error for answer in replans] == [False, False, False]
    first_order = replans[0].structured_content["order_id"]
    assert {answer.structured_content["order_id"] for answer in replans} == {first_order}
    # Two orders in the database: the re-planned one once, and the one under the host's own key.
    assert Order.objects.count() == 2 and chosen.structured_content["order_id"] != first_order
    assert IdempotencyRecord.objects.filter(tool="create_order").count() == 2


@pytest.mark.live
def test_a_hosts_trace_goes_through_the_proxy_and_the_record_joins_it(web_server, token, tmp_path):
    # The host's MCP client sends its span's context in `_meta.traceparent` (the SDK injects it).
    async def scenario():
        async with host(web_server.mcp_url, token, tmp_path / "ledger.sqlite") as client:
            with trace.get_tracer("the-host").start_as_current_span("host turn") as turn:
                answer = await client.call_tool("create_order", ORDER)
            return answer, format(turn.get_span_context().trace_id, "032x")

    answer, host_trace = asyncio.run(scenario())

    assert not answer.is_error, answer.content
    assert IdempotencyRecord.objects.get(tool="create_order").trace_id == host_trace


@pytest.mark.live
def test_a_lost_answer_between_proxy_and_server_makes_one_order_and_gives_the_first_result(web_server, token,
                                                                                             tmp_path):
    async def scenario():
        async with FaultProxy(web_server.base_url) as faults:
            faults.inject("drop_response", "create_order")
            async with host(faults.url_for(web_server.mcp_url), token, tmp_path / "ledger.sqlite") as client:
                result = await client.call_tool("create_order", ORDER)
            return result, faults.calls("create_order")

    result, requests = asyncio.run(scenario())

    order = Order.objects.get()
    assert [r.fault for r in requests] == ["drop_response", None] and requests[0].key == requests[1].key
    assert requests[0].structured["order_id"] == order.pk == result.structured_content["order_id"]
    assert result.structured_content["idempotency"]["replayed"] is True


def inspector(*args: str, timeout: float = 90) -> subprocess.CompletedProcess:
    return subprocess.run([str(INSPECTOR), "--cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "CI": "true"})


@pytest.mark.live
def test_the_mcp_inspector_calling_create_order_twice_through_two_proxy_runs_makes_one_order(web_server, token,
                                                                                            tmp_path):
    command = proxy_command(web_server.mcp_url, tmp_path / "ledger.sqlite")
    call = ["--method", "tools/call", "--tool-name", "create_order", "--tool-arg", "customer=ACME",
            "currency=EUR", "items=" + json.dumps(ORDER["items"]), "-e", f"IDEMOPS_TOKEN={token}", "--", *command]

    runs = [inspector(*call) for _ in range(2)]

    for run in runs:
        assert run.returncode == 0, run.stdout + run.stderr
    first, second = (json.loads(run.stdout) for run in runs)
    order = Order.objects.get()
    assert first["structuredContent"]["order_id"] == order.pk == second["structuredContent"]["order_id"]
    assert second["_meta"]["io.idemops/from-ledger"] is True


# --- bad input: a clear message, nothing sent --------------------------------------------------


def run_proxy(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
                          env={**os.environ, **(env or {})})


@pytest.mark.live
def test_a_refused_token_ends_the_proxy_with_a_message_saying_so(web_server, tmp_path):
    done = run_proxy(*proxy_command(web_server.mcp_url, tmp_path / "l.sqlite", "--token", "idm_revoked"))

    assert done.returncode == 2 and "refused the token" in done.stderr and "issue_token" in done.stderr


def test_a_wrong_url_ends_the_proxy_with_a_message_naming_it(tmp_path):
    url = "http://127.0.0.1:9/mcp"  # the discard port: nothing listens
    done = run_proxy(*proxy_command(url, tmp_path / "l.sqlite", "--token", "idm_x"))

    assert done.returncode == 2 and f"cannot reach an idemops server at {url}" in done.stderr


# --- OAuth: the proxy signs in in the person's browser ------------------------------------------------


def oauth_host(url: str, ledger: Path, env: dict[str, str], port: int) -> Client:
    command = proxy_command(url, ledger, "--oauth", "--callback-port", str(port))
    return Client(StdioServerParameters(command=command[0], args=command[1:], cwd=ROOT, env=env))


@pytest.mark.live
def test_the_proxy_signs_in_by_oauth_once_keeps_its_tokens_to_its_user_and_serves_a_host(web_server, token,
                                                                                          tmp_path):
    acme = Tenant.objects.get(slug="acme")
    olga = make_operator("olga", OPERATOR, acme)
    browser_session = console(web_server.base_url, olga)  # logged in with password and authenticator code
    consents = tmp_path / "consents.log"
    env = {"XDG_CONFIG_HOME": str(tmp_path / "config"), "CONSENT_LOG": str(consents),
           "CONSENT_COOKIES": json.dumps(dict(browser_session.cookies)), "CONSENT_TENANT": str(acme.pk),
           "BROWSER": f"{sys.executable} {ROOT / 'tests' / 'client' / 'consenting_browser.py'} %s"}
    port = free_port()

    async def scenario(items):
        async with oauth_host(web_server.mcp_url, tmp_path / "ledger.sqlite", env, port) as client:
            return await client.call_tool("create_order", {**ORDER, "items": items})

    first = asyncio.run(scenario(ORDER["items"]))
    again = asyncio.run(scenario([{"sku": "NUT-2", "quantity": 1, "unit_price": "0.50"}]))  # a restarted host

    assert not first.is_error and not again.is_error, (first.content, again.content)
    assert Order.objects.count() == 2
    # One person, one consent: the second run used the stored tokens, without the browser.
    assert len(consents.read_text().splitlines()) == 1
    connection = AgentConnection.objects.get(user=olga)
    assert connection.tenant == acme and connection.application.name == "idemops-client proxy"
    stored = tmp_path / "config" / "idemops-client" / "oauth" / token_path(web_server.mcp_url).name
    assert stat.S_IMODE(stored.stat().st_mode) == 0o600 and stat.S_IMODE(stored.parent.stat().st_mode) == 0o700
    assert json.loads(stored.read_text())["tokens"]["refresh_token"]

    # A token file other users may read is refused before anything is sent, naming the fix.
    stored.chmod(0o644)
    done = run_proxy(*proxy_command(web_server.mcp_url, tmp_path / "ledger.sqlite", "--oauth"), env=env)

    assert done.returncode == 2 and f"chmod 600 {stored}" in done.stderr, done.stderr
    assert len(consents.read_text().splitlines()) == 1 and Order.objects.count() == 2


def test_a_corrupt_ledger_file_ends_the_proxy_before_anything_is_sent(tmp_path):
    ledger = tmp_path / "ledger.sqlite"
    ledger.write_bytes(b"this is not a SQLite database, just text " * 100)

    done = run_proxy(*proxy_command("http://127.0.0.1:9/mcp", ledger, "--token", "idm_x"))

    assert done.returncode == 2 and f"ledger {ledger}" in done.stderr and "not a ledger" in done.stderr
    assert "cannot reach" not in done.stderr  # it stopped before trying the server


def test_a_read_only_ledger_ends_the_proxy_with_a_message_saying_so(tmp_path):
    # File modes do not stop root (these tests' user), a read-only file system does: a tmpfs of its own.
    mounted = tmp_path / "ro"
    mounted.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mounted)],
                      capture_output=True).returncode != 0:
        missing = "needs to mount a tmpfs (root with CAP_SYS_ADMIN) to make a file system read-only"
        if os.environ.get("CI"):
            pytest.fail(missing)  # CI never skips it: .ci/run checks that a tmpfs can be mounted
        pytest.skip(missing)
    try:
        ledger = mounted / "ledger.sqlite"
        made = Ledger(ledger)  # a valid ledger, made while it was writable
        made.entries("host-1")
        made.close()
        subprocess.run(["mount", "-o", "remount,ro", str(mounted)], check=True)

        done = run_proxy(*proxy_command("http://127.0.0.1:9/mcp", ledger, "--token", "idm_x"))

        assert done.returncode == 2 and f"ledger {ledger}" in done.stderr and "read-only" in done.stderr
        assert "cannot reach" not in done.stderr  # it stopped before trying the server
    finally:
        subprocess.run(["umount", str(mounted)], check=False)


def test_a_ledger_locked_by_another_process_says_so_and_records_nothing(tmp_path):
    path = tmp_path / "ledger.sqlite"
    ledger = Ledger(path, busy_timeout=0.2)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(LedgerError, match="locked by another process"):
            ledger.add(ledger.new_entry(session_id="s", tool="create_order", call_id="k", key="k",
                                        fingerprint="f", arguments={}))
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert ledger.entries("s") == []


def test_the_oauth_token_file_is_written_for_its_owner_only_and_refused_once_others_may_read_it(tmp_path):
    from mcp.shared.auth import OAuthToken

    from idemops_client.oauth import SignInError, TokenFile

    store = TokenFile(tmp_path / "oauth" / "server.json", "https://idemops.example/mcp")
    asyncio.run(store.set_tokens(OAuthToken(access_token="at-1", refresh_token="rt-1")))

    assert stat.S_IMODE(store.path.stat().st_mode) == 0o600 and stat.S_IMODE(store.path.parent.stat().st_mode) == 0o700
    assert asyncio.run(store.get_tokens()).refresh_token == "rt-1"
    # A file is one server's sign-in: under another URL it reads as empty.
    assert asyncio.run(TokenFile(store.path, "https://other.example/mcp").get_tokens()) is None
    store.path.parent.chmod(0o755)
    with pytest.raises(SignInError, match=f"chmod 700 {store.path.parent}"):
        asyncio.run(store.get_tokens())
    store.path.parent.chmod(0o700)
    store.path.chmod(0o640)
    with pytest.raises(SignInError, match=f"chmod 600 {store.path}"):
        asyncio.run(store.get_tokens())
