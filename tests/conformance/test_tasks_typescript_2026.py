"""The 2026-07-28 tasks extension (io.modelcontextprotocol/tasks) driven by the TypeScript SDK's own tasks client,
@modelcontextprotocol/ext-tasks over @modelcontextprotocol/client 2.x (tests/interop/tasks_client_2026.mjs),
against the live platform and its workers.

The official conformance suite has no tasks scenario (docs/extension/official-suite.md), so this is the
third-party check of idemops's tasks at that revision; the Python SDK's is tests/mcp/test_mcp_tasks_extension.py,
and 2025-11-25's with the TypeScript SDK 1.x is tests/mcp/test_mcp_tasks_2025.py."""

import base64
import json
import subprocess

import pytest

from tests.support.documents_fixtures import long_text, make_pdf, pdf_of_text
from tools_app.models import Task, TaskStatus

pytestmark = [pytest.mark.live, pytest.mark.conformance, pytest.mark.usefixtures("settle_tasks")]


def typescript(interop, url: str, token: str, scenario: str, arguments: dict) -> dict:
    done = subprocess.run(["node", "tasks_client_2026.mjs", url, token, scenario, json.dumps(arguments)],
                          cwd=interop, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_typescript_tasks_client_gets_a_task_handle_and_drives_it_to_the_tools_result(
        interop, task_web, task_workers, token):
    # when the TypeScript tasks client calls the long tool at 2026-07-28
    seen = typescript(interop, task_web.mcp_url, token, "settle", {"tool": "ingest_document", "arguments": {
        "text": "# Handbook\n\nPallets go to dock **four**.", "idempotency_key": "ts26-settle"}})

    # then it negotiated the revision, read the extension, got a task and drove it to the tool's result
    assert seen["protocol"] == "modern" and seen["tasksExtension"] == {}
    assert seen["capabilities"]["execution"] and seen["capabilities"]["cancellation"]
    call = seen["call"]
    task = Task.objects.get(pk=call["taskId"])
    assert call["kind"] == "task" and call["status"] == "completed" and seen["seen"][-1] == "completed"
    assert call["result"]["isError"] is False
    assert call["result"]["structuredContent"]["document_id"] == task.document.pk
    assert call["result"]["structuredContent"]["idempotency"]["replayed"] is False
    assert task.status == TaskStatus.SUCCEEDED and task.tool == "ingest_document"


def test_the_same_key_from_a_second_typescript_session_answers_the_same_task(interop, task_web, task_workers, token):
    # when one agent starts the task and hands it off, and a second, on its own connection, calls with the same key
    seen = typescript(interop, task_web.mcp_url, token, "same-key", {"tool": "ingest_document", "arguments": {
        "text": "One key, one task.", "idempotency_key": "ts26-same"}})

    # then both got the same task (the idempotency extension's section 11), which completed once
    assert seen["kinds"] == ["task", "task"] and seen["taskIds"][0] == seen["taskIds"][1]
    assert seen["call"]["status"] == "completed"
    assert Task.objects.count() == 1 and str(Task.objects.get().pk) == seen["taskIds"][0]


def test_a_paused_task_asks_the_typescript_client_for_input_and_finishes_with_its_answer(
        interop, task_web, task_workers, token):
    # given a scanned PDF: the task pauses for its text
    scan = base64.b64encode(make_pdf([[]])).decode()
    answer = "Dictated: the berth schedule slips a day."

    # when the TypeScript client's input handler answers the task's input request
    seen = typescript(interop, task_web.mcp_url, token, "input", {"tool": "ingest_document", "answer": answer,
                                                                  "arguments": {"content_base64": scan,
                                                                                "idempotency_key": "ts26-scan"}})

    # then the request came as a task's elicitation, and the task finished with the answer
    assert [(r["kind"], r["scope"]) for r in seen["requests"]] == [("elicitation", "task")]
    assert "input_required" in seen["seen"] and seen["call"]["status"] == "completed"
    assert seen["call"]["result"]["structuredContent"]["characters"] == len(answer)
    assert Task.objects.get().resume_input == {"text": answer}


def test_the_typescript_client_cancels_a_running_task(interop, task_web, task_workers, token, doc_dir):
    path = doc_dir / "ts26-cancel.pdf"
    path.write_bytes(pdf_of_text(long_text(1_500_000)))

    seen = typescript(interop, task_web.mcp_url, token, "cancel", {"tool": "ingest_document", "arguments": {
        "path": str(path), "idempotency_key": "ts26-cancel"}})

    assert seen["kind"] == "task" and seen["call"]["status"] == "cancelled" and seen["after"] == "cancelled"
    assert Task.objects.get(pk=seen["taskId"]).status == TaskStatus.CANCELLED
