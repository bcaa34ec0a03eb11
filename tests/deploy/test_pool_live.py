"""Processes on Django's connection pool (IDEMOPS_DB_POOL_MAX_SIZE), as docs/deploy.md describes it: a
process's threads share the pool's connections, each taking one for a call or a job and handing it back.

A web process driven by real MCP clients over HTTP with more calls at once than it has connections:
every key still commits one effect, every retry gets the first call's answer, and the process never
holds more of the database's connections than its pool; with a pool of one, it still serves (start-up
hands back what it read). A job cluster, whose workers django-q2 forks from it, runs its jobs on a pool
of one without any process using another's connection.
"""

from __future__ import annotations

import asyncio
import threading

import psycopg
import pytest
from django.db import connection
from django_q.tasks import async_task, result

from idemops_demo.models import Order
from tests.support.mcp_client import call
from tests.support.processes import WebServer, Worker
from tests.support.task_stack import wait_until
from tools_app.models import IdempotencyRecord, RecordStatus

pytestmark = pytest.mark.live

POOL = 2
DB_THREADS = 8
KEYS = 12
ORDER = {"customer": "ACME", "items": [{"sku": "BOLT-1", "quantity": 3, "unit_price": "2.50"}], "currency": "EUR"}
APP_NAME = "idemops-web-pool"  # the web process's backends carry it (libpq's PGAPPNAME)


class Watch(threading.Thread):
    """Counts, every 20 ms from a connection of its own, the test database's backends of the web process."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        params = connection.get_connection_params()
        self.params = {k: v for k, v in params.items() if k in ("dbname", "user", "password", "host", "port")}
        self.peak, self.done = 0, threading.Event()

    def run(self) -> None:
        with psycopg.connect(**self.params, autocommit=True) as watcher:
            while not self.done.wait(0.02):
                (count,) = watcher.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                                           "AND application_name = %s", [APP_NAME]).fetchone()
                self.peak = max(self.peak, count)


def test_a_web_process_on_a_pool_of_two_serves_more_calls_at_once_with_one_effect_a_key(token):
    web = WebServer("web-pool", IDEMOPS_DB_POOL_MAX_SIZE=str(POOL), IDEMOPS_MCP_DB_THREADS=str(DB_THREADS),
                    PGAPPNAME=APP_NAME)
    watch = Watch()
    watch.start()
    try:
        async def storm() -> list:
            # Each key twice at once (a client's retry racing its first call), all keys together.
            return await asyncio.gather(*(call(web.mcp_url, token, "create_order", {**ORDER, "idempotency_key": key})
                                          for key in [f"pool-{n}" for n in range(KEYS)] for _ in range(2)))

        results = asyncio.run(storm())
    finally:
        watch.done.set()
        watch.join()
        web.stop()

    errors = [answer.structured_content for answer in results if answer.is_error]
    # A retry that finds its first call still running may hear in_progress; nothing else may fail.
    assert all(error["error"]["class"] == "in_progress" for error in errors), errors
    answers = {answer.structured_content["order_id"] for answer in results if not answer.is_error}
    records = IdempotencyRecord.objects.filter(tool="create_order", key__startswith="pool-")
    assert records.count() == KEYS and all(record.status == RecordStatus.SUCCEEDED for record in records)
    assert Order.objects.filter(record__in=records).count() == KEYS  # one effect a key
    assert len(answers) == KEYS  # every answer names its key's one order
    assert 0 < watch.peak <= POOL, f"the web process held {watch.peak} connections with a pool of {POOL}"


def test_a_web_process_on_a_pool_of_one_is_ready_and_serves(token):
    web = WebServer("web-pool-of-one", IDEMOPS_DB_POOL_MAX_SIZE="1")  # ready: /healthz answered
    try:
        answer = asyncio.run(call(web.mcp_url, token, "create_order", {**ORDER, "idempotency_key": "pool-of-one"}))
        assert not answer.is_error, answer.structured_content
    finally:
        web.stop()
    assert Order.objects.filter(record__key="pool-of-one").count() == 1


def test_a_job_cluster_on_a_pool_of_one_runs_its_jobs_in_its_forked_workers(transactional_db):
    cluster = Worker("jobs-pool-of-one", IDEMOPS_DB_POOL_MAX_SIZE="1", IDEMOPS_Q_WORKERS="2")
    try:
        jobs = [async_task("math.floor", n + 0.5) for n in range(10)]
        wait_until(lambda: all(result(job) is not None for job in jobs), what="the cluster's ten results")
        assert [result(job) for job in jobs] == list(range(10))
        with open(cluster.log_path, "rb") as log:
            log.seek(cluster._log_start)
            errors = [line for line in log.read().decode().splitlines() if '"level": "error"' in line]
    finally:
        cluster.stop()
    # A connection used from two processes at once fails in ways of its own ("the last operation didn't
    # produce records"): the scheduled sweeps and the broker's reads, each logged as an error.
    assert errors == []
