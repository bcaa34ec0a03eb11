"""A server without `prepare_operation` (issue 25 §5): a high-risk tool there takes only ids the server
issues, and nothing issues one. The caller and the host are told so in words; nothing is sent twice.

The server is another make (tests/client/no_prepare_server.py: the bare `mcp` SDK, no idemops), run as a
real uvicorn process; it counts the requests that reach its tool."""

import asyncio
import json
import os
import socket
import sys
import time

import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from idemops_client import IdempotentClient, MemoryLedger, RetryPolicy, ToolCallError
from tests.support.processes import ROOT, Service, free_port

pytestmark = pytest.mark.live

QUICK = RetryPolicy(max_attempts=4, max_seconds=20, base_delay=0.05, max_delay=0.2, attempt_timeout=10)


@pytest.fixture
def other_server():
    port = free_port()
    service = Service("no-prepare", [sys.executable, "-m", "uvicorn", "tests.client.no_prepare_server:app",
                                     "--host", "127.0.0.1", "--port", str(port), "--no-access-log"],
                      dict(os.environ))
    url = f"http://127.0.0.1:{port}/mcp"
    _wait_listening(service, port)
    yield url
    service.stop()


def _wait_listening(service: Service, port: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if service.process.poll() is not None:
            raise RuntimeError(f"the server exited: {service.log_tail()}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"the server is not listening: {service.log_tail()}")


async def received(url: str) -> list[str]:
    async with IdempotentClient(url, "unused", ledger=MemoryLedger(), policy=QUICK) as client:
        return (await client.call("calls", {})).structured["keys"]


def test_a_high_risk_call_without_a_key_is_refused_in_words_before_anything_is_sent(other_server):
    async def scenario():
        async with IdempotentClient(other_server, "unused", ledger=MemoryLedger(), policy=QUICK) as client:
            with pytest.raises(ToolCallError) as refused:
                await client.call("pay", {"amount": "10.00"})
            return refused.value, client.ledger.entries()

    error, entries = asyncio.run(scenario())

    assert error.error_class == "invalid_input" and error.attempts == 0
    assert "offers no prepare_operation" in error.message and "pay takes only operation ids" in error.message
    assert entries == [] and asyncio.run(received(other_server)) == []


def test_a_high_risk_call_with_a_key_of_its_own_is_sent_once_and_refused_in_words(other_server):
    async def scenario():
        async with IdempotentClient(other_server, "unused", ledger=MemoryLedger(), policy=QUICK) as client:
            with pytest.raises(ToolCallError) as refused:
                await client.call("pay", {"amount": "10.00"}, key="my-own-key")
            return refused.value

    error = asyncio.run(scenario())

    assert error.error_class == "invalid_input" and error.attempts == 1
    assert "offers no prepare_operation" in error.message
    assert asyncio.run(received(other_server)) == ["my-own-key"]


def test_a_host_through_the_proxy_is_told_why_and_nothing_reaches_the_tool(other_server, tmp_path):
    command = [sys.executable, "-m", "idemops_client", "proxy", "--url", other_server, "--ledger",
               str(tmp_path / "ledger.sqlite"), "--session", "host-1", "--max-seconds", "20"]

    async def scenario():
        host = Client(StdioServerParameters(command=command[0], args=command[1:], cwd=ROOT,
                                            env={"IDEMOPS_TOKEN": "unused", "PATH": os.environ["PATH"]}))
        async with host as client:
            return await client.call_tool("pay", {"amount": "10.00"})

    answer = asyncio.run(scenario())

    assert answer.is_error
    text = " ".join(part.text for part in answer.content if part.type == "text")
    assert "offers no prepare_operation" in text, text
    assert json.dumps(answer.structured_content["error"]["operation_id_required"]) == "true"
    assert asyncio.run(received(other_server)) == []
