"""Long tasks end to end: the SDK's client over real HTTP, a real django-q2 cluster, real PostgreSQL.

The cluster runs with a 2 s lease and 0.3 s heartbeats (tests/support/task_stack.py)
so that retries and cancellations play out in seconds; every wait polls for a
condition.
"""

import asyncio
import base64
from collections import Counter

import pytest
from django_q.tasks import async_task

from idemops_demo.models import Document
from tests.support.documents_fixtures import long_text, make_pdf, pdf_of_text
from tests.support.mcp_client import call, call_sync, connect, error_of
from tests.support.task_stack import wait_until
from tools_app.core.jobs import JOBS
from tools_app.models import AuditEvent, Checkpoint, StepOutcome, StepRun, Task, TaskStatus

pytestmark = [pytest.mark.live, pytest.mark.usefixtures("settle_tasks")]

STEPS = ["receive", "detect_format", "extract_text", "chunk", "index", "embed", "summarize"]


def start(web, token, arguments, key, **kwargs):
    return call_sync(web.mcp_url, token, "start_task",
                     {"tool": "ingest_document", "arguments": arguments, "idempotency_key": key}, **kwargs)


def task_of(result) -> Task:
    assert not result.is_error, result.structured_content
    return Task.objects.get(pk=result.structured_content["task_id"])


def step_runs(task) -> Counter:
    return Counter(StepRun.objects.filter(task=task).values_list("step", flat=True))


def status_of(task) -> str:
    task.refresh_from_db()
    return task.status


def big_pdf(doc_dir, name: str, chars: int) -> str:
    path = doc_dir / name
    if not path.exists():
        path.write_bytes(pdf_of_text(long_text(chars), title=name))
    return str(path)


def inside_step(task, step: str, done: float = 3):
    """True once the worker is inside `step` and has reported progress in it."""
    task.refresh_from_db()
    return task.current_step == step and (task.progress_done or 0) >= done


def test_twenty_identical_start_task_calls_at_once_create_one_task(task_web, task_workers, token):
    # given twenty agents sending the same start_task at the same moment
    arguments = {"tool": "ingest_document", "arguments": {"text": "Twenty callers, one task."},
                 "idempotency_key": "same-20"}

    async def twenty():
        return await asyncio.gather(*(call(task_web.mcp_url, token, "start_task", arguments) for _ in range(20)))

    # when
    results = asyncio.run(twenty())

    # then: one task, and every caller holds its id
    assert [r.is_error for r in results] == [False] * 20
    assert Task.objects.count() == 1
    assert {r.structured_content["task_id"] for r in results} == {str(Task.objects.get().pk)}
    assert sum(not r.structured_content["idempotency"]["replayed"] for r in results) == 1
    task = Task.objects.get()
    wait_until(lambda: status_of(task) == TaskStatus.SUCCEEDED, what="the task to succeed")
    assert Document.objects.count() == 1


def test_the_same_key_with_other_arguments_is_a_conflict_and_starts_nothing(task_web, task_workers, token):
    task = task_of(start(task_web, token, {"text": "first"}, "k-conflict"))

    result = start(task_web, token, {"text": "second"}, "k-conflict")

    assert error_of(result)["class"] == "conflict" and error_of(result)["differing_fields"] == ["arguments.text"]
    assert list(Task.objects.values_list("pk", flat=True)) == [task.pk]


def test_a_client_that_disconnects_and_reconnects_gets_the_same_task_by_key(task_web, task_workers, token,
                                                                             doc_dir):
    # given a start_task whose connection is gone once it answered (each call_sync is its own connection)
    path = big_pdf(doc_dir, "reconnect.pdf", 300_000)
    first = task_of(start(task_web, token, {"path": path}, "reconnect-1"))

    # when the agent reconnects and sends the same call again, then calls the tool itself with the key
    again = start(task_web, token, {"path": path}, "reconnect-1")
    direct = call_sync(task_web.mcp_url, token, "ingest_document", {"path": path, "idempotency_key": "reconnect-1"})

    # then it is the same task: replayed, and the direct call waits for that task
    assert again.structured_content["task_id"] == str(first.pk)
    assert again.structured_content["idempotency"]["replayed"] is True
    if direct.is_error:  # not finished within the call's wait: in_progress naming the same task
        assert error_of(direct)["class"] == "in_progress" and error_of(direct)["task_id"] == str(first.pk)
    else:  # finished within the wait: that task's document
        assert direct.structured_content["document_id"] == Document.objects.get(task_id=first.pk).pk
    wait_until(lambda: status_of(first) == TaskStatus.SUCCEEDED, what="the task to succeed")
    finished = call_sync(task_web.mcp_url, token, "ingest_document", {"path": path, "idempotency_key": "reconnect-1"})
    assert finished.structured_content["document_id"] == Document.objects.get().pk
    assert Task.objects.count() == 1


def test_cancel_during_a_step_cancels_at_once_and_no_later_step_runs(task_web, task_workers, token,
                                                                      doc_dir):
    # given a task inside its text extraction (a long PDF, page by page)
    task = task_of(start(task_web, token, {"path": big_pdf(doc_dir, "cancel.pdf", 1_500_000)}, "cancel-1"))
    wait_until(lambda: inside_step(task, "extract_text"), what="the worker to be inside extract_text")

    # when the agent cancels it
    result = call_sync(task_web.mcp_url, token, "cancel_task",
                       {"task_id": str(task.pk), "reason": "not needed", "idempotency_key": "cancel-1-c"})

    # then it is cancelled at once; the running step stops at its next check and nothing after it starts
    assert result.structured_content["status"] == "cancelled"
    assert result.structured_content["cancellable"] is False
    extract = StepRun.objects.get(task=task, step="extract_text")
    wait_until(lambda: StepRun.objects.get(pk=extract.pk).finished_at, what="the step to notice the cancel")
    assert StepRun.objects.get(pk=extract.pk).outcome == StepOutcome.INTERRUPTED
    assert status_of(task) == TaskStatus.CANCELLED
    assert set(step_runs(task)) == {"receive", "detect_format", "extract_text"}
    assert not Checkpoint.objects.filter(task=task, step="extract_text").exists()
    assert not Document.objects.exists()
    status = call_sync(task_web.mcp_url, token, "get_task_status", {"task_id": str(task.pk)}).structured_content
    assert (status["status"], status["retryable"]) == ("cancelled", False)
    assert "not needed" in Task.objects.get(pk=task.pk).failure_reason


def test_a_transient_failure_retries_with_backoff_then_succeeds(task_web, task_workers, token,
                                                               doc_server):
    # given a document server that is unavailable twice, then serves the document
    url = doc_server.serve("flaky.md", b"# Flaky\n\nIt answers **503** twice, then [works](http://x).\n",
                           statuses=[503, 503])

    # when the task runs
    task = task_of(start(task_web, token, {"url": url}, "flaky-1"))
    result = call_sync(task_web.mcp_url, token, "get_task_result", {"task_id": str(task.pk), "wait_seconds": 60})

    # then it retried twice, waiting longer the second time, and succeeded
    assert not result.is_error, result.structured_content
    assert result.structured_content["result"]["title"] == "Flaky"
    assert result.structured_content["result"]["format"] == "markdown"
    assert doc_server.hits["/docs/flaky.md"] == 3
    receive = list(StepRun.objects.filter(task=task, step="receive").values_list("outcome", "attempt"))
    assert receive == [(StepOutcome.FAILED, 1), (StepOutcome.FAILED, 2), (StepOutcome.SUCCEEDED, 3)]
    retries = [event.after for event in AuditEvent.objects.filter(object_id=str(task.pk),
                                                                  action="task.retry_scheduled")]
    assert [r["status"] for r in retries] == ["retrying", "retrying"]
    assert 0.2 <= retries[0]["retry_in_seconds"] <= 0.4 <= retries[1]["retry_in_seconds"] <= 0.8
    task.refresh_from_db()
    assert (task.status, task.attempts, step_runs(task)["detect_format"]) == (TaskStatus.SUCCEEDED, 3, 1)


def test_a_deterministic_failure_fails_without_retry_and_resume_refuses_with_the_reason(
        task_web, task_workers, token, doc_server):
    # given a URL that does not exist
    url = doc_server.fail("missing.pdf", 404)

    # when the task runs
    task = task_of(start(task_web, token, {"url": url}, "missing-1"))
    wait_until(lambda: status_of(task) == TaskStatus.FAILED, what="the task to fail")

    # then it failed at once, not retried, and says why
    assert doc_server.hits["/docs/missing.pdf"] == 1
    assert (task.failure_class, task.attempts) == ("not_found", 1)
    assert list(StepRun.objects.filter(task=task).values_list("step", "outcome")) == [
        ("receive", StepOutcome.FAILED)]
    status = call_sync(task_web.mcp_url, token, "get_task_status", {"task_id": str(task.pk)}).structured_content
    assert (status["retryable"], status["failure_class"]) == (False, "not_found")
    assert "404" in status["failure_reason"] and "new idempotency_key" in status["next_action"]
    refused = call_sync(task_web.mcp_url, token, "resume_task", {"task_id": str(task.pk),
                                                                 "idempotency_key": "missing-1-r"})
    error = error_of(refused)
    assert error["class"] == "not_found" and "404" in error["message"] and error["task_status"] == "failed"
    result = call_sync(task_web.mcp_url, token, "get_task_result", {"task_id": str(task.pk)})
    assert error_of(result)["class"] == "not_found"
    assert status_of(task) == TaskStatus.FAILED and doc_server.hits["/docs/missing.pdf"] == 1


def test_a_checkpoint_whose_checksum_no_longer_matches_makes_its_step_run_again(task_web, task_workers, token):
    # given a task paused in extract_text (a scanned PDF: no text layer) after two checkpointed steps
    scan = base64.b64encode(make_pdf([[], []])).decode()
    task = task_of(start(task_web, token, {"content_base64": scan, "filename": "scan.pdf"}, "scan-1"))
    wait_until(lambda: status_of(task) == TaskStatus.PAUSED, what="the task to pause")
    status = call_sync(task_web.mcp_url, token, "get_task_status", {"task_id": str(task.pk)}).structured_content
    assert status["input_request"]["text"]["schema"] == {"type": "string", "minLength": 1}
    assert status["completed_steps"] == ["receive", "detect_format"] and status["retryable"] is True

    # when the detect_format checkpoint's stored output is altered, and the task resumed with the text
    Checkpoint.objects.filter(task=task, step="detect_format").update(output_inline='{"format":"html"}')
    resumed = call_sync(task_web.mcp_url, token, "resume_task", {
        "task_id": str(task.pk), "input": {"text": "Typed in by a person. The scan said hello."},
        "idempotency_key": "scan-1-r"})
    assert resumed.structured_content["status"] == "created"
    wait_until(lambda: status_of(task) == TaskStatus.SUCCEEDED, what="the task to succeed")

    # then the altered step ran again (and the steps after it); the step before it did not
    assert step_runs(task) == Counter({"receive": 1, "detect_format": 2, "extract_text": 2, "chunk": 1,
                                       "index": 1, "embed": 1, "summarize": 1})
    assert AuditEvent.objects.filter(object_id=str(task.pk), action="task.checkpoint_rejected").count() == 1
    document = Document.objects.get()
    assert (document.format, document.title) == ("pdf", "scan.pdf")
    assert "hello" in document.chunks.get().text


def test_a_caller_waiting_for_a_result_gets_progress_notifications(task_web, task_workers, token,
                                                                    doc_dir):
    # given a long task
    task = task_of(start(task_web, token, {"path": big_pdf(doc_dir, "progress.pdf", 1_000_000)}, "progress-1"))
    seen = []

    async def progress(done, total, message):
        seen.append((done, total, message))

    # when the agent waits for its result with a progress token
    result = call_sync(task_web.mcp_url, token, "get_task_result", {"task_id": str(task.pk), "wait_seconds": 60},
                       progress_callback=progress)

    # then it saw the steps move, in order, up to all six
    assert not result.is_error, result.structured_content
    assert len(seen) >= 3
    assert [done for done, _, _ in seen] == sorted(done for done, _, _ in seen)
    assert seen[-1][:2] == (7.0, 7.0) and {total for _, total, _ in seen} == {7.0}
    assert any(message.startswith("extract_text: page") for _, _, message in seen)


def test_another_tenants_task_is_not_found(task_web, task_workers, token, other_token):
    task = task_of(start(task_web, token, {"text": "Mine."}, "mine-1"))

    for tool, extra in [("get_task_status", {}), ("get_task_result", {}),
                        ("cancel_task", {"idempotency_key": "theirs-c"}),
                        ("resume_task", {"idempotency_key": "theirs-r"})]:
        result = call_sync(task_web.mcp_url, other_token, tool, {"task_id": str(task.pk), **extra})
        assert error_of(result)["class"] == "not_found", tool
    assert call_sync(task_web.mcp_url, token, "get_task_status", {"task_id": str(task.pk)}).is_error is False


def test_two_workers_never_run_the_same_task_even_when_it_is_delivered_several_times(task_web, task_workers, token,
                                                                                      doc_dir):
    # given a task whose job is delivered three more times (django-q2 delivers at least once)
    task = task_of(start(task_web, token, {"path": big_pdf(doc_dir, "twice.pdf", 300_000)}, "twice-1"))
    for _ in range(3):
        async_task(JOBS["tasks.run_task"], str(task.pk))

    # when the two workers take the jobs
    wait_until(lambda: status_of(task) == TaskStatus.SUCCEEDED, what="the task to succeed")

    # then each step ran once, under one lease
    assert step_runs(task) == Counter(dict.fromkeys(STEPS, 1))
    assert AuditEvent.objects.filter(object_id=str(task.pk), action="task.taken").count() == 1


def test_a_document_of_a_few_megabytes_sent_inline_is_ingested_and_searchable(task_web, task_workers, token):
    # given a 3 MB PDF sent inline (base64) through MCP
    pdf = pdf_of_text(long_text(2_600_000, seed=11) + "\n\nThe zeppelin quartermaster signed.", title="Big")
    assert len(pdf) > 3_000_000

    # when it is ingested
    task = task_of(start(task_web, token, {"content_base64": base64.b64encode(pdf).decode()}, "big-1"))
    # (wait_seconds is at most 60: an agent that will wait longer calls again)
    for _ in range(4):
        result = call_sync(task_web.mcp_url, token, "get_task_result", {"task_id": str(task.pk), "wait_seconds": 60})
        if not (result.is_error and error_of(result)["class"] == "in_progress"):
            break

    # then it is indexed in full and found by a word from its last page
    assert not result.is_error, result.structured_content
    ingested = result.structured_content["result"]
    assert ingested["format"] == "pdf" and ingested["characters"] > 2_500_000 and ingested["chunks"] > 2000
    hits = call_sync(task_web.mcp_url, token, "search_documents", {"query": "zeppelin quartermaster",
                                                                    "mode": "keyword"})
    assert [hit["document_id"] for hit in hits.structured_content["hits"]] == [ingested["document_id"]]
    assert "**zeppelin**" in hits.structured_content["hits"][0]["snippet"]


def test_tools_list_shows_the_long_tool_and_the_task_tools(task_web, token):
    async def tools():
        async with connect(task_web.mcp_url, token) as client:
            return {tool.name: tool for tool in (await client.list_tools()).tools}

    listed = asyncio.run(tools())

    assert {"ingest_document", "start_task", "get_task_status", "get_task_result", "resume_task",
            "cancel_task", "search_documents", "get_document"} <= set(listed)
    ingest = listed["ingest_document"]
    assert "idempotency_key" in ingest.input_schema["required"]
    assert {"document_id", "summary", "idempotency"} <= set(ingest.output_schema["properties"])
    assert listed["get_task_status"].annotations.read_only_hint is True
    assert listed["cancel_task"].annotations.read_only_hint is False
