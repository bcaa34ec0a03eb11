"""The MCP tasks extension (io.modelcontextprotocol/tasks, protocol 2026-07-28) over real HTTP.

The client side is the SDK's own extension machinery: a ClientExtension
whose ResultClaim resolves a `resultType: "task"` answer by polling
`tasks/get`, as a client speaking the extension does.
"""

import asyncio
from contextlib import asynccontextmanager
from typing import Any, Literal

import httpx2
import pytest
from mcp import Client
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolResult, Request, RequestParams, Result
from pydantic import ConfigDict

from tests.support.documents_fixtures import long_text, make_pdf, pdf_of_text
from tests.support.mcp_client import call_sync
from tools_app.models import Task, TaskStatus

pytestmark = [pytest.mark.live, pytest.mark.usefixtures("settle_tasks")]

EXTENSION = "io.modelcontextprotocol/tasks"
MODERN = "2026-07-28"


class CreateTaskResult(Result):
    result_type: Literal["task"] = "task"
    task_id: str
    status: str
    status_message: str | None = None
    created_at: str
    last_updated_at: str
    ttl_ms: int | None = None
    poll_interval_ms: int | None = None


class DetailedTask(Result):
    model_config = ConfigDict(extra="allow")
    task_id: str
    status: str
    status_message: str | None = None
    result: dict[str, Any] | None = None
    input_requests: dict[str, Any] | None = None


class Ack(Result):
    """tasks/update and tasks/cancel answer an empty result."""

    model_config = ConfigDict(extra="allow")
    result_type: str


class TaskIdParams(RequestParams):
    task_id: str


class UpdateTaskParams(TaskIdParams):
    input_responses: dict[str, Any]


class GetTask(Request[TaskIdParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    params: TaskIdParams
    name_param = "taskId"


class CancelTask(Request[TaskIdParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    params: TaskIdParams
    name_param = "taskId"


class UpdateTask(Request[UpdateTaskParams, Literal["tasks/update"]]):
    method: Literal["tasks/update"] = "tasks/update"
    params: UpdateTaskParams
    name_param = "taskId"


class TasksClient(ClientExtension):
    """Resolves task handles by polling tasks/get; answers input requests with `answers`."""

    identifier = EXTENSION

    def __init__(self, answers: dict[str, Any] | None = None):
        self.answers = answers or {}
        self.handles: list[CreateTaskResult] = []
        self.seen: list[str] = []

    def claims(self):
        return [ResultClaim(result_type="task", model=CreateTaskResult, resolve=self.resolve)]

    async def resolve(self, handle: CreateTaskResult, ctx: ClaimContext) -> CallToolResult:
        self.handles.append(handle)
        deadline = asyncio.get_running_loop().time() + 120
        while asyncio.get_running_loop().time() < deadline:
            task = await get_task(ctx.session, handle.task_id)
            self.seen.append(task.status)
            if task.status == "completed":
                return CallToolResult.model_validate(task.result)
            if task.status == "cancelled":
                raise RuntimeError(f"task cancelled: {task.status_message}")
            if task.status == "input_required" and self.answers:
                await answer(ctx.session, handle.task_id, task.input_requests, self.answers)
            await asyncio.sleep(0.1)
        raise TimeoutError(f"task {handle.task_id} did not complete; statuses seen: {self.seen[-5:]}")


async def get_task(session, task_id: str) -> DetailedTask:
    return await session.send_request(GetTask(params=TaskIdParams(task_id=task_id)), DetailedTask)


async def answer(session, task_id: str, input_requests: dict[str, Any], answers: dict[str, Any]) -> None:
    responses = {}
    for key, request in input_requests.items():
        name = next(iter(request["params"]["requestedSchema"]["properties"]))
        responses[key] = {"action": "accept", "content": {name: answers[name]}}
    await session.send_request(UpdateTask(params=UpdateTaskParams(task_id=task_id, input_responses=responses)), Ack)


@asynccontextmanager
async def modern_client(url: str, token: str, extension: ClientExtension | None = None, mode: str = MODERN):
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60) as http:
        async with Client(streamable_http_client(url, http_client=http), mode=mode,
                          extensions=[extension] if extension else None) as client:
            yield client


def test_a_client_speaking_the_extension_gets_a_task_handle_then_the_result_by_polling(task_web, task_workers,
                                                                                      token):
    extension = TasksClient()

    async def ingest():
        async with modern_client(task_web.mcp_url, token, extension) as client:
            return await client.call_tool("ingest_document", {
                "text": "# Handbook\n\nPallets go to dock **four**.\n\n- forklifts\n- cranes\n",
                "idempotency_key": "ext-1"})

    # when the client calls the long tool
    result = asyncio.run(ingest())

    # then it got a durable task handle at once, polled it, and received the tool's result
    handle = extension.handles[0]
    task = Task.objects.get(pk=handle.task_id)
    assert handle.status == "working" and handle.poll_interval_ms > 0
    # and its time-to-live from creation is the task's deadline: the tool's (a week: it declares none)
    assert handle.ttl_ms == 7 * 24 * 3600 * 1000 == (task.deadline_at - task.created_at).total_seconds() * 1000
    assert extension.seen[-1] == "completed"
    assert result.is_error is False
    assert result.structured_content["document_id"] == task.document.pk
    assert result.structured_content["title"] == "Handbook" and result.structured_content["format"] == "markdown"
    assert task.status == TaskStatus.SUCCEEDED and task.tool == "ingest_document"


def test_the_same_key_through_the_extension_and_start_task_is_one_task(task_web, task_workers, token):
    arguments = {"text": "One operation, three doors.", "idempotency_key": "ext-same"}

    async def handles():
        async with modern_client(task_web.mcp_url, token, TasksClient()) as client:
            first = await client.session.call_tool("ingest_document", arguments, allow_claimed=True)
        async with modern_client(task_web.mcp_url, token, TasksClient()) as client:
            again = await client.session.call_tool("ingest_document", arguments, allow_claimed=True)
        return first, again

    first, again = asyncio.run(handles())
    legacy = call_sync(task_web.mcp_url, token, "start_task", {
        "tool": "ingest_document", "arguments": {"text": arguments["text"]}, "idempotency_key": "ext-same"})

    assert isinstance(first, CreateTaskResult) and isinstance(again, CreateTaskResult)
    assert first.task_id == again.task_id == legacy.structured_content["task_id"]
    assert Task.objects.count() == 1


def test_a_paused_task_is_input_required_and_tasks_update_resumes_it(task_web, task_workers, token):
    # given a scanned PDF: the task pauses for its text
    import base64

    scan = base64.b64encode(make_pdf([[]])).decode()
    extension = TasksClient(answers={"text": "Dictated: the berth schedule slips a day."})

    async def ingest():
        async with modern_client(task_web.mcp_url, token, extension) as client:
            return await client.call_tool("ingest_document", {"content_base64": scan, "idempotency_key": "ext-scan"})

    # when the client answers the input request through tasks/update
    result = asyncio.run(ingest())

    # then the task went through input_required and finished with the supplied text
    assert "input_required" in extension.seen and extension.seen[-1] == "completed"
    assert result.structured_content["characters"] == len("Dictated: the berth schedule slips a day.")
    task = Task.objects.get()
    assert task.resume_input == {"text": "Dictated: the berth schedule slips a day."}


def test_tasks_cancel_cancels_the_task(task_web, task_workers, token, doc_dir):
    path = doc_dir / "ext-cancel.pdf"
    path.write_bytes(pdf_of_text(long_text(1_500_000)))

    async def start_then_cancel():
        async with modern_client(task_web.mcp_url, token, TasksClient()) as client:
            handle = await client.session.call_tool("ingest_document", {
                "path": str(path), "idempotency_key": "ext-cancel"}, allow_claimed=True)
            ack = await client.session.send_request(CancelTask(params=TaskIdParams(task_id=handle.task_id)), Ack)
            return handle, ack, await get_task(client.session, handle.task_id)

    handle, ack, after = asyncio.run(start_then_cancel())

    assert ack.result_type == "complete" and not ack.model_extra
    assert after.status == "cancelled"
    assert Task.objects.get(pk=handle.task_id).status == TaskStatus.CANCELLED


def test_a_failed_task_completes_with_an_error_result(task_web, task_workers, token, doc_server):
    url = doc_server.fail("ext-gone.html", 410)

    async def ingest():
        async with modern_client(task_web.mcp_url, token, TasksClient()) as client:
            return await client.call_tool("ingest_document", {"url": url, "idempotency_key": "ext-gone"})

    result = asyncio.run(ingest())

    # a tool-level failure is a completed call whose result is an error, as SEP-2663 asks
    assert result.is_error is True
    assert result.structured_content["error"]["class"] == "not_found"
    assert "410" in result.structured_content["error"]["message"]


def test_tasks_methods_need_the_extension_and_the_callers_own_task(task_web, task_workers, token, other_token):
    async def probe():
        async with modern_client(task_web.mcp_url, token, TasksClient()) as client:
            handle = await client.session.call_tool("ingest_document", {
                "text": "Private to acme.", "idempotency_key": "ext-private"}, allow_claimed=True)
        async with modern_client(task_web.mcp_url, other_token, TasksClient()) as client:
            with pytest.raises(MCPError) as foreign:
                await get_task(client.session, handle.task_id)
        async with modern_client(task_web.mcp_url, token) as client:
            with pytest.raises(MCPError) as undeclared:
                await get_task(client.session, handle.task_id)
            plain = await client.call_tool("ingest_document", {"text": "Private to acme.",
                                                                "idempotency_key": "ext-private"})
        return handle, foreign.value, undeclared.value, plain

    handle, foreign, undeclared, plain = asyncio.run(probe())

    assert foreign.code == -32602  # another tenant's task is an unknown task
    assert undeclared.code == -32021  # missing required client capability
    assert undeclared.data["requiredCapabilities"]["extensions"] == {EXTENSION: {}}
    # a client without the extension gets an ordinary answer for the same operation: the result, or in_progress
    if plain.is_error:
        assert plain.structured_content["error"]["task_id"] == handle.task_id
    else:
        assert plain.structured_content["document_id"] == Task.objects.get(pk=handle.task_id).document.pk
