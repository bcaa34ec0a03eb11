"""Task status pushed instead of polled: MCP `notifications/tasks` on a `subscriptions/listen` stream
(protocol 2026-07-28, the tasks extension), and a webhook when a task finishes (through the outbox).

The web server here re-reads a waited-on task only every 10 minutes by itself
(IDEMOPS_TASK_WATCH_POLL_SECONDS=600): every push these tests see was woken by
the task's change notice (PostgreSQL NOTIFY, sent by a django-q2 worker
process), or by the listener reconnecting after its connection was killed.
"""

import asyncio
import json
from typing import Any, Literal

import anyio
import httpx2
import psycopg
import pytest
from mcp import Client
from mcp.client.extension import ClaimContext, ClientExtension, NotificationBinding, ResultClaim
from mcp.client.streamable_http import streamable_http_client
from mcp_types import (
    Result,
    SubscriptionsAcknowledgedNotification,
    SubscriptionsListenResult,
)
from pydantic import ConfigDict

from idemops_demo.models import Document
from tests.support import processes
from tests.support.documents_fixtures import long_text, pdf_of_text
from tests.support.mcp_client import Listen, ListenParams, TaskPush, call_sync, error_of
from tests.support.processes import downstream_env
from tests.support.task_stack import live_stack, stack_env, wait_until
from tools_app import tasks
from tools_app.models import OutboxEvent, Task, TaskStatus

pytestmark = [pytest.mark.live, pytest.mark.usefixtures("settle_tasks")]

EXTENSION = "io.modelcontextprotocol/tasks"
SUBSCRIPTION_ID = "io.modelcontextprotocol/subscriptionId"


@pytest.fixture(scope="module")
def push_env(doc_dir, doc_server, _gateway, _sink):
    return {**stack_env(doc_dir, doc_server), **downstream_env(_gateway, _sink),
            "IDEMOPS_TASK_WATCH_POLL_SECONDS": "600"}


push_web, push_workers = live_stack("push_env", "push")


# --- a 2026-07-28 client that listens to its tasks ----------------------------------------------------


class Handle(Result):
    model_config = ConfigDict(extra="allow")
    result_type: Literal["task"] = "task"
    task_id: str
    status: str


class Listener(ClientExtension):
    """Declares the tasks extension; takes task handles as they are and collects task pushes."""

    identifier = EXTENSION

    def __init__(self):
        self.pushes: list[TaskPush] = []

    def claims(self):
        return [ResultClaim(result_type="task", model=Handle, resolve=self.resolve)]

    async def resolve(self, handle: Handle, ctx: ClaimContext):
        raise AssertionError("these tests take the handle itself (allow_claimed)")

    def notifications(self):
        return [NotificationBinding(method="notifications/tasks", params_type=TaskPush, handler=self.on_push)]

    async def on_push(self, params: TaskPush) -> None:
        self.pushes.append(params)


class Session:
    def __init__(self, client: Client, listener: Listener, acks: list):
        self.client, self.acks = client, acks
        self.pushes = listener.pushes

    async def start(self, tool: str, arguments: dict[str, Any]) -> Handle:
        return await self.client.session.call_tool(tool, arguments, allow_claimed=True)

    async def listen(self, task_ids: list[str]) -> SubscriptionsListenResult:
        """Returns when the server ends the stream (its tasks all done, or none of them the caller's)."""
        closed = await self.client.session.send_request(
            Listen(params=ListenParams(notifications={"taskIds": task_ids})), SubscriptionsListenResult,
            request_read_timeout_seconds=300)
        # Bound notifications drain through a queue of their own: wait for the last one sent before the close.
        honoured = set(self.acks[-1].notifications.model_extra["taskIds"])
        with anyio.fail_after(10):
            while not honoured <= {push.task_id for push in self.pushes if push.status in ("completed", "cancelled")}:
                await anyio.sleep(0.02)
        return closed


def run_session(url: str, token: str, scenario) -> Any:
    async def main():
        listener, acks = Listener(), []

        async def on_message(message):
            if isinstance(message, SubscriptionsAcknowledgedNotification):
                acks.append(message.params)

        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=300) as http:
            async with Client(streamable_http_client(url, http_client=http), mode="2026-07-28",
                              extensions=[listener], message_handler=on_message) as client:
                return await scenario(Session(client, listener, acks))

    return asyncio.run(main())


def big_pdf(doc_dir, name: str, chars: int) -> str:
    path = doc_dir / name
    if not path.exists():
        path.write_bytes(pdf_of_text(long_text(chars), title=name))
    return str(path)


def webhook_body(sink, event) -> dict:
    (body,), = sink.sql("SELECT body FROM messages WHERE event_id = %s", [str(event.id)])
    return json.loads(body) if isinstance(body, str) else body


def listener_pids() -> list[int]:
    """The backends of the web processes' task watchers (LISTEN connections) on the test database."""
    with psycopg.connect(processes.test_database_url(), autocommit=True) as connection:
        return [pid for (pid,) in connection.execute(
            "SELECT pid FROM pg_stat_activity WHERE query = %s", [f"LISTEN {tasks.CHANGES_CHANNEL}"])]


def test_a_client_listening_to_its_task_hears_each_change_until_it_completes(push_web, push_workers, token,
                                                                              doc_dir):
    path = big_pdf(doc_dir, "push.pdf", 600_000)

    async def scenario(session: Session):
        handle = await session.start("ingest_document", {"path": path, "idempotency_key": "push-1"})
        closed = await session.listen([handle.task_id])
        return handle, closed, session.acks, session.pushes

    # when the client starts a long task and listens to it
    handle, closed, acks, pushes = run_session(push_web.mcp_url, token, scenario)

    # then the server agreed to that task, pushed its changes as the worker made them, and ended the stream
    # once it completed; the last push carries the tool's result, as tasks/get would
    assert acks[-1].notifications.model_extra["taskIds"] == [handle.task_id]
    assert closed.result_type == "complete"
    task = Task.objects.get(pk=handle.task_id)
    assert task.status == TaskStatus.SUCCEEDED
    statuses = [push.status for push in pushes]
    assert statuses[0] == "working" and statuses[-1] == "completed" and statuses.count("completed") == 1
    assert len(statuses) >= 4  # steps and pages, as the worker moved
    assert pushes[-1].model_extra["result"]["structuredContent"]["document_id"] == Document.objects.get(task=task).pk
    assert {push.task_id for push in pushes} == {handle.task_id}
    assert {push.meta[SUBSCRIPTION_ID] for push in pushes} == {closed.meta[SUBSCRIPTION_ID]}


def test_a_listen_follows_only_the_callers_own_tasks(push_web, push_workers, token, other_token):
    theirs = call_sync(push_web.mcp_url, other_token, "start_task", {
        "tool": "ingest_document", "arguments": {"text": "Globex only."}, "idempotency_key": "theirs"})
    their_id = theirs.structured_content["task_id"]

    async def scenario(session: Session):
        closed = await session.listen([their_id, "not-a-task-id"])
        return closed, session.acks, session.pushes

    closed, acks, pushes = run_session(push_web.mcp_url, token, scenario)

    # another tenant's task is an unknown task: not honoured, nothing pushed, the stream ends at once
    assert acks[-1].notifications.model_extra["taskIds"] == []
    assert closed.result_type == "complete" and pushes == []


def test_pushes_go_on_after_the_listener_connection_is_killed(push_web, push_workers, token, doc_dir):
    path = big_pdf(doc_dir, "push-kill.pdf", 900_000)
    killed = []

    async def kill_the_listener_once_pushes_flow(session: Session):
        with anyio.fail_after(120):
            while not session.pushes:
                await anyio.sleep(0.05)
            before = await anyio.to_thread.run_sync(listener_pids)
            with psycopg.connect(processes.test_database_url(), autocommit=True) as connection:
                for pid in before:
                    connection.execute("SELECT pg_terminate_backend(%s)", [pid])
            killed.extend(before)

    async def scenario(session: Session):
        handle = await session.start("ingest_document", {"path": path, "idempotency_key": "push-kill"})
        async with anyio.create_task_group() as group:
            group.start_soon(kill_the_listener_once_pushes_flow, session)
            closed = await session.listen([handle.task_id])
        return handle, closed, session.pushes

    # when the web process's LISTEN connection is killed while a client listens to a running task
    handle, closed, pushes = run_session(push_web.mcp_url, token, scenario)

    # then the watcher reconnected, and the client still heard the task through to its completion
    assert killed and closed.result_type == "complete"
    assert pushes[-1].status == "completed" and Task.objects.get(pk=handle.task_id).status == TaskStatus.SUCCEEDED
    assert set(wait_until(listener_pids, what="a new listener")).isdisjoint(killed)


# --- the completion webhook, through the outbox ----------------------------------------------------------


def test_a_finished_task_posts_its_webhook_once_with_the_outbox_event_id(push_web, push_workers, token, sink):
    result = call_sync(push_web.mcp_url, token, "start_task", {
        "tool": "ingest_document", "arguments": {"text": "# Manifest\n\nTwelve containers."},
        "notify_url": f"{sink.url}/webhooks/tasks", "idempotency_key": "hook-1"})
    task = Task.objects.get(pk=result.structured_content["task_id"])

    # when the task finishes, the relay delivers its event
    messages = wait_until(sink.messages, what="the webhook")
    event = OutboxEvent.objects.get(kind=tasks.WEBHOOK_KIND)
    wait_until(lambda: OutboxEvent.objects.get(pk=event.pk).status == "delivered", what="the event marked delivered")

    # then the receiver got it once, under the event id, with the task's final status and result
    assert messages == {str(event.id): 1}
    body = webhook_body(sink, event)
    task.refresh_from_db()
    assert body["type"] == "task.finished" and body["task_id"] == str(task.pk)
    assert (body["status"], body["tool"]) == ("succeeded", "ingest_document")
    assert body["result"]["document_id"] == Document.objects.get(task=task).pk
    assert event.record_id == task.record_id and event.payload["recipient"] == f"{sink.url}/webhooks/tasks"
    assert event.operation_id == task.operation_id is not None  # sent as X-Operation-Id


def test_a_cancelled_task_posts_its_webhook_too(push_web, push_workers, token, sink, doc_dir):
    path = big_pdf(doc_dir, "hook-cancel.pdf", 1_500_000)
    started = call_sync(push_web.mcp_url, token, "start_task", {
        "tool": "ingest_document", "arguments": {"path": path}, "notify_url": f"{sink.url}/webhooks/tasks",
        "idempotency_key": "hook-cancel"})
    task_id = started.structured_content["task_id"]

    call_sync(push_web.mcp_url, token, "cancel_task", {"task_id": task_id, "reason": "wrong file",
                                                       "idempotency_key": "hook-cancel-c"})

    messages = wait_until(sink.messages, what="the webhook")
    event = OutboxEvent.objects.get(kind=tasks.WEBHOOK_KIND)
    body = webhook_body(sink, event)
    assert messages == {str(event.id): 1}
    assert (body["task_id"], body["status"], body["result"]) == (task_id, "cancelled", None)
    assert "wrong file" in body["failure_reason"]


def test_a_notify_url_off_the_allow_list_is_refused_before_the_key_is_claimed(push_web, token):
    refused = call_sync(push_web.mcp_url, token, "start_task", {
        "tool": "ingest_document", "arguments": {"text": "x"}, "notify_url": "https://example.org/hook",
        "idempotency_key": "hook-bad"})

    error = error_of(refused)
    assert error["class"] == "invalid_input" and error["message"].startswith("notify_url:")
    assert not Task.objects.exists()
