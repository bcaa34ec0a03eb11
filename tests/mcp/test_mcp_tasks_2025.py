"""MCP tasks at protocol 2025-11-25, driven by the TypeScript SDK's own client (@modelcontextprotocol/sdk 1.x).

tests/interop/tasks_client.mjs runs a scenario with the SDK's `experimental.tasks` API against the live
server and prints what it saw; these tests run it with `node` and check that, and the database.
"""

import asyncio
import json
import subprocess
from datetime import timedelta
from typing import Literal

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import PaginatedRequestParams, Request, Result

from idemops_demo.models import Document
from tests.support.documents_fixtures import long_text, pdf_of_text
from tests.support.interop_support import INTEROP, installed
from tests.support.mcp_client import answer_of, call_sync
from tests.support.task_stack import wait_until
from tests.support.tasks_support import start
from tools_app import access
from tools_app.conf import override_conf
from tools_app.models import StepRun, Task, TaskStatus
from tools_app.toolkit.calls import Caller

pytestmark = [pytest.mark.live, pytest.mark.usefixtures("settle_tasks")]

RELATED_TASK = "io.modelcontextprotocol/related-task"


@pytest.fixture(scope="session")
def ts_client():
    """Runs a scenario of tasks_client.mjs; `make test` installs its npm packages (npm ci), and so does this."""
    installed()

    def run(url: str, token: str, scenario: str, arguments: dict) -> dict:
        done = subprocess.run(["node", "tasks_client.mjs", url, token, scenario, json.dumps(arguments)],
                              cwd=INTEROP, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        seen = json.loads(done.stdout.strip().splitlines()[-1])
        assert seen["clientErrors"] == [], seen["clientErrors"]  # e.g. a message its schemas refused
        return seen

    return run


def big_pdf(doc_dir, name: str, chars: int) -> str:
    path = doc_dir / name
    if not path.exists():
        path.write_bytes(pdf_of_text(long_text(chars), title=name))
    return str(path)


def test_the_typescript_client_calls_a_long_tool_as_a_task_polls_it_and_reads_its_result(
        task_web, task_workers, token, ts_client):
    # when the TypeScript client calls ingest_document as a task, polls tasks/get, then reads tasks/result
    seen = ts_client(task_web.mcp_url, token, "poll", {"tool": "ingest_document", "arguments": {
        "text": "# Berths\n\nThe *Aurora* docks at berth 7 on Tuesday.", "idempotency_key": "ts-poll"}})

    # then it negotiated 2025-11-25, saw the tasks capability and which tools take a task
    assert seen["protocol"] == "2025-11-25"
    assert seen["tasksCapability"] == {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}
    assert seen["taskSupport"] == dict.fromkeys(["ingest_document", "onboard_customer", "process_ticket_batch"],
                                                "optional")
    # and it got a working task at once, watched it complete, and read the tool's result
    task = Task.objects.get()
    created = seen["created"]
    assert (created["taskId"], created["status"]) == (str(task.pk), "working")
    # and the ttl it asked for (60 s, shorter than the tool's deadline) is the task's deadline, and its answer
    assert created["ttl"] == 60000 and task.deadline_at - task.created_at == task.time_allowed == timedelta(seconds=60)
    assert created["pollInterval"] > 0 and created["statusMessage"]
    assert seen["seen"][-1] == "completed" and set(seen["seen"]) <= {"working", "completed"}
    assert seen["result"]["isError"] is False
    assert seen["result"]["structuredContent"]["document_id"] == Document.objects.get(task=task).pk
    assert seen["result"]["structuredContent"]["title"] == "Berths"
    assert seen["result"]["meta"][RELATED_TASK] == {"taskId": str(task.pk)}
    assert {"taskId": str(task.pk), "status": "completed"} in seen["list"]
    # and it is the same start_task operation as every other door: the same key names the same task
    again = call_sync(task_web.mcp_url, token, "start_task", {"tool": "ingest_document", "arguments": {
        "text": "# Berths\n\nThe *Aurora* docks at berth 7 on Tuesday."}, "idempotency_key": "ts-poll"})
    assert again.structured_content["task_id"] == str(task.pk) and Task.objects.count() == 1


def test_the_typescript_clients_call_tool_stream_runs_a_long_tool_to_its_result(task_web, task_workers, token,
                                                                                 ts_client):
    seen = ts_client(task_web.mcp_url, token, "stream", {"tool": "ingest_document", "arguments": {
        "text": "Cranes are idle on Sundays.", "idempotency_key": "ts-stream"}})

    assert seen["isToolTask"] is True  # it learnt from tools/list that the tool takes a task
    messages = seen["messages"]
    assert messages[0] == {"taskCreated": "working", "taskId": str(Task.objects.get().pk)}
    assert messages[-1]["isError"] is False
    assert messages[-1]["result"]["document_id"] == Document.objects.get().pk
    assert Task.objects.get().status == TaskStatus.SUCCEEDED


def test_tasks_result_waits_for_the_task_and_pushes_its_status_and_progress_meanwhile(
        task_web, task_workers, token, ts_client, doc_dir):
    # given a document whose extraction takes a while
    path = big_pdf(doc_dir, "ts-wait.pdf", 600_000)

    # when the client asks for the result at once (the request blocks until the task is done)
    seen = ts_client(task_web.mcp_url, token, "wait", {"tool": "ingest_document", "arguments": {
        "path": path, "idempotency_key": "ts-wait"}})

    # then it got the result, and on the same stream the task's statuses and its progress, in order
    task = Task.objects.get(pk=seen["taskId"])
    assert seen["result"]["isError"] is False
    assert seen["result"]["structuredContent"]["document_id"] == Document.objects.get(task=task).pk
    assert seen["result"]["meta"][RELATED_TASK] == {"taskId": str(task.pk)}
    assert seen["statusPushes"][0] == "working" and seen["statusPushes"][-1] == "completed"
    assert len(seen["statusPushes"]) >= 3
    done = [progress for progress, _, _ in seen["progress"]]
    assert done == sorted(done) and len(done) >= 3
    assert seen["progress"][-1][:2] == [7, 7]  # the ingest's seven steps
    assert any(message.startswith("extract_text: page") for _, _, message in seen["progress"])


def test_the_typescript_client_cancels_a_task_and_a_second_cancel_is_refused(task_web, task_workers, token,
                                                                              ts_client, doc_dir):
    path = big_pdf(doc_dir, "ts-cancel.pdf", 1_500_000)

    seen = ts_client(task_web.mcp_url, token, "cancel", {"tool": "ingest_document", "arguments": {
        "path": path, "idempotency_key": "ts-cancel"}})

    assert seen["cancelled"]["status"] == "cancelled" and seen["cancelled"]["taskId"] == seen["taskId"]
    assert seen["after"]["status"] == "cancelled"
    assert seen["cancelAgain"]["code"] == -32602
    assert "already in terminal status 'cancelled'" in seen["cancelAgain"]["message"]
    # the result of a cancelled task is what the call would have answered: an error saying so
    assert seen["result"]["isError"] is True
    assert seen["result"]["structuredContent"]["error"]["class"] == "already_done"
    task = Task.objects.get(pk=seen["taskId"])
    assert task.status == TaskStatus.CANCELLED
    wait_until(lambda: not StepRun.objects.filter(task=task, finished_at=None).exists(),
               what="a running step to notice the cancel")
    assert not Document.objects.filter(task=task).exists()


def test_a_failed_task_is_failed_at_2025_11_25_and_its_result_is_the_error(task_web, task_workers, token,
                                                                           ts_client, doc_server):
    url = doc_server.fail("ts-gone.html", 410)

    seen = ts_client(task_web.mcp_url, token, "poll", {"tool": "ingest_document", "arguments": {
        "url": url, "idempotency_key": "ts-gone"}})

    assert seen["final"]["status"] == "failed" and "410" in seen["final"]["statusMessage"]
    assert seen["result"]["isError"] is True
    assert seen["result"]["structuredContent"]["error"]["class"] == "not_found"


def test_unknown_foreign_and_unsupported_requests_get_the_errors_the_spec_names(task_web, task_workers, token,
                                                                                other_token, ts_client):
    theirs = call_sync(task_web.mcp_url, other_token, "start_task", {
        "tool": "ingest_document", "arguments": {"text": "Globex only."}, "idempotency_key": "theirs"})

    seen = ts_client(task_web.mcp_url, token, "refusals",
                     {"foreignTaskId": theirs.structured_content["task_id"]})

    assert seen["unknownTask"]["code"] == -32602 and "Task not found" in seen["unknownTask"]["message"]
    assert seen["foreignTask"]["code"] == -32602  # another tenant's task is an unknown task
    assert seen["notATaskTool"]["code"] == -32601  # `task` on a tool without taskSupport
    assert seen["badCursor"]["code"] == -32602


def rpc(url: str, token: str, method: str, params: dict) -> dict:
    """One raw JSON-RPC request at 2025-11-25 (stateless: no session, no initialize needed)."""
    response = httpx2.post(url, timeout=30, json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params},
                           headers={"Authorization": f"Bearer {token}", "MCP-Protocol-Version": "2025-11-25",
                                    "Accept": "application/json, text/event-stream"})
    return answer_of(response)


def test_tasks_list_pages_through_the_tenants_tasks_newest_first(task_web, task_workers, token, settings):
    override_conf(settings, max_concurrent_tasks_per_agent=0)  # 57 unfinished tasks of one agent: no limit
    caller = Caller(tenant_id=access.models.Tenant.objects.get(slug="acme").pk, actor="agent:acme/test")
    started = [str(start(caller, {"text": f"Note {n}."}, key=f"list-{n}").pk) for n in range(57)]

    first = rpc(task_web.mcp_url, token, "tasks/list", {})["result"]
    second = rpc(task_web.mcp_url, token, "tasks/list", {"cursor": first["nextCursor"]})["result"]

    assert len(first["tasks"]) == 50 and len(second["tasks"]) == 7 and "nextCursor" not in second
    assert [t["taskId"] for t in first["tasks"] + second["tasks"]] == started[::-1]
    assert {t["status"] for t in first["tasks"]} <= {"working", "completed"}
    assert first["tasks"][0]["ttl"] == WEEK_MS  # the tool's deadline: start_task asks for none


WEEK_MS = 7 * 24 * 3600 * 1000


def test_a_requested_ttl_longer_than_the_tools_deadline_gets_the_tools_and_one_that_is_no_duration_is_refused(
        task_web, task_workers, token):
    def call(key: str, task: dict) -> dict:
        return rpc(task_web.mcp_url, token, "tools/call", {
            "name": "ingest_document", "arguments": {"text": "Berth 7.", "idempotency_key": key}, "task": task})

    longer = call("ttl-long", {"ttl": 30 * 24 * 3600 * 1000})["result"]["task"]
    tasks_before = Task.objects.count()
    refused = call("ttl-bad", {"ttl": -5})

    assert longer["ttl"] == WEEK_MS
    assert Task.objects.get(pk=longer["taskId"]).time_allowed == timedelta(days=7)
    assert refused["error"]["code"] == -32602 and "task.ttl" in refused["error"]["message"]
    assert Task.objects.count() == tasks_before  # refused before any task existed


class ListTasks(Request[PaginatedRequestParams, Literal["tasks/list"]]):
    method: Literal["tasks/list"] = "tasks/list"
    params: PaginatedRequestParams


def test_tasks_list_is_not_served_at_2026_07_28(task_web, token):
    async def list_at_2026():
        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=30) as http:
            async with Client(streamable_http_client(task_web.mcp_url, http_client=http), mode="2026-07-28") as client:
                with pytest.raises(MCPError) as refused:
                    await client.session.send_request(ListTasks(params=PaginatedRequestParams()), Result)
                return refused.value

    assert asyncio.run(list_at_2026()).code == -32601
