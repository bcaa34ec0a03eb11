"""idemops behind PgBouncer in transaction mode, with the settings docs/deploy.md gives for it.

A web process and a job cluster reach the test database only through PgBouncer (1.18, Debian's:
older than 1.21, so IDEMOPS_DB_SERVER_SIDE_BINDING=false, and IDEMOPS_DB_DISABLE_SERVER_SIDE_CURSORS
=true), with fewer server connections than the web process has database threads. The one thing
that needs a session, the web process's LISTEN for task changes, goes around the pooler
(IDEMOPS_DATABASE_LISTEN_URL); its waiters re-read a task only every 10 minutes by themselves, so
every push seen here was woken by a NOTIFY that a pooled worker sent and the direct LISTEN heard.
"""

from __future__ import annotations

import asyncio
import csv
import io

import httpx2
import psycopg
import pytest

from idemops_demo.models import Document, Order
from tests.mcp.test_mcp_task_push import Session, big_pdf, listener_pids, run_session, webhook_body
from tests.support import processes
from tests.support.mcp_client import call
from tests.support.pooler import PgBouncer
from tests.support.processes import downstream_env
from tests.support.task_stack import live_stack, stack_env, wait_until
from tools_app import tasks
from tools_app.access import auditors
from tools_app.models import IdempotencyRecord, OutboxEvent, Task, TaskStatus, Tenant

pytestmark = [pytest.mark.live, pytest.mark.usefixtures("settle_tasks")]

ORDER = {"customer": "ACME", "items": [{"sku": "BOLT-1", "quantity": 3, "unit_price": "2.50"}], "currency": "EUR"}
POOL_SIZE = 6
STORM = 30


@pytest.fixture(scope="module")
def pooler(django_db_setup, django_db_blocker):
    with django_db_blocker.unblock():
        bouncer = PgBouncer(pool_size=POOL_SIZE)
    yield bouncer
    bouncer.stop()


@pytest.fixture(scope="module")
def pooled_env(pooler, doc_dir, doc_server, _gateway, _sink):
    return {**stack_env(doc_dir, doc_server), **downstream_env(_gateway, _sink),
            # docs/deploy.md, "Behind PgBouncer in transaction mode", for a PgBouncer before 1.21
            "DATABASE_URL": pooler.url(), "IDEMOPS_DB_SERVER_SIDE_BINDING": "false",
            "IDEMOPS_DB_DISABLE_SERVER_SIDE_CURSORS": "true",
            "IDEMOPS_DATABASE_LISTEN_URL": processes.test_database_url(),
            # and the key store on the server directly (docs/deploy.md, "The key store")
            "IDEMOPS_KEYSTORE_URL": keystore_url(),
            "IDEMOPS_TASK_WATCH_POLL_SECONDS": "600", "IDEMOPS_FOLLOWER_WAIT_SECONDS": "10"}


def keystore_url() -> str:
    """The test run's key store (its database beside the test database's), on the server directly."""
    from tools_app.core import keystore

    keystore.counts()  # the test run's key store exists once this process has reached it
    url = processes.test_database_url()
    path, _, query = url.partition("?")
    return f"{path}_keys?{query}"


pooled_web, pooled_workers = live_stack("pooled_env", "pooled")


def pooled_transactions(pooler: PgBouncer) -> int:
    database = psycopg.conninfo.conninfo_to_dict(processes.test_database_url())["dbname"]
    return sum(int(row["total_xact_count"]) for row in pooler.show("STATS") if row["database"] == database)


def server_pids(pooler: PgBouncer) -> set[int]:
    # The main database's pool only: the key store (core.keystore) is a database of its own, with a pool of its own.
    return {int(row["remote_pid"]) for row in pooler.show("SERVERS")
            if row["remote_pid"] and not str(row.get("database", "")).endswith("_keys")}


def test_a_storm_of_identical_calls_through_the_pooler_executes_once_and_answers_everyone_alike(
        pooler, pooled_web, token):
    before = pooled_transactions(pooler)

    async def storm():
        return await asyncio.gather(*(call(pooled_web.mcp_url, token, "create_order",
                                           {**ORDER, "idempotency_key": "pooled-storm"}) for _ in range(STORM)))

    results = asyncio.run(storm())

    assert [r.structured_content for r in results if r.is_error] == []
    assert {r.structured_content["order_id"] for r in results} == {Order.objects.get().pk}
    assert sum(1 for r in results if not r.structured_content["idempotency"]["replayed"]) == 1
    assert IdempotencyRecord.objects.get().attempts == 1
    # every call's statements went through the pooler, on at most its pool of server connections
    assert pooled_transactions(pooler) - before >= STORM
    assert len(server_pids(pooler)) <= POOL_SIZE


def test_a_long_task_through_the_pooler_is_pushed_to_its_listener_by_the_direct_listen(
        pooler, pooled_web, pooled_workers, token, doc_dir):
    path = big_pdf(doc_dir, "pooled.pdf", 600_000)

    async def scenario(session: Session):
        handle = await session.start("ingest_document", {"path": path, "idempotency_key": "pooled-task"})
        closed = await session.listen([handle.task_id])
        return handle, closed, session.pushes

    handle, closed, pushes = run_session(pooled_web.mcp_url, token, scenario)

    # the task ran, step by step, in a worker connected through the pooler
    task = Task.objects.get(pk=handle.task_id)
    assert task.status == TaskStatus.SUCCEEDED and task.attempts == 1
    # its changes were pushed as they happened, woken by NOTIFY (waiters poll every 10 minutes only)
    statuses = [push.status for push in pushes]
    assert closed.result_type == "complete" and statuses[-1] == "completed" and len(statuses) >= 4
    assert pushes[-1].model_extra["result"]["structuredContent"]["document_id"] == Document.objects.get(task=task).pk
    # heard on a connection of its own, not one of the pooler's
    listening = set(listener_pids())
    assert listening and listening.isdisjoint(server_pids(pooler))


def test_a_finished_tasks_webhook_goes_out_once_by_the_outbox_through_the_pooler(
        pooler, pooled_web, pooled_workers, token, sink):
    started = asyncio.run(call(pooled_web.mcp_url, token, "start_task", {
        "tool": "ingest_document", "arguments": {"text": "# Manifest\n\nTwelve containers."},
        "notify_url": f"{sink.url}/webhooks/tasks", "idempotency_key": "pooled-hook"}))
    task_id = started.structured_content["task_id"]

    messages = wait_until(sink.messages, what="the webhook")
    event = OutboxEvent.objects.get(kind=tasks.WEBHOOK_KIND)
    wait_until(lambda: OutboxEvent.objects.get(pk=event.pk).status == "delivered", what="the event delivered")

    assert messages == {str(event.id): 1}
    body = webhook_body(sink, event)
    assert (body["task_id"], body["status"]) == (task_id, "succeeded")


def test_an_auditors_export_through_the_pooler_is_whole_without_server_side_cursors(pooler, pooled_web, token):
    for number in range(3):
        result = asyncio.run(call(pooled_web.mcp_url, token, "create_order",
                                  {**ORDER, "idempotency_key": f"pooled-export-{number}"}))
        assert not result.is_error, result.structured_content
    _, raw = auditors.issue_key("pooled-auditor", [Tenant.objects.get(slug="acme")], actor="system:test")

    answer = httpx2.get(f"{pooled_web.base_url}/api/v1/idempotency-records/export.csv",
                        headers={"Authorization": f"Bearer {raw}"}, timeout=30)

    assert answer.status_code == 200, answer.text[:500]
    rows = list(csv.DictReader(io.StringIO(answer.text)))
    assert sorted(row["operation_id"] for row in rows) == sorted(
        str(pk) for pk in IdempotencyRecord.objects.values_list("operation_id", flat=True))
    assert len(rows) == 3
