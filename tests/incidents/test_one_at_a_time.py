"""Issue 42 §4, across real processes: a tool's concurrency key keeps two operations on one business
entity from running at once, whichever web process each call reaches, while other entities run in
parallel. Each run of the handler is a row with its start and end (the database's clock); overlaps are
counted in SQL. The same storm on the same tool without the key does overlap: the count finds them."""

from __future__ import annotations

import asyncio
import time

import httpx2
import pytest
from django.db import connection

from tests.support.agents import Answer, call_until_done
from tests.support.entity_runs import RUNS_TABLE
from tests.support.processes import WebServer

pytestmark = pytest.mark.live

OVERLAPS = """SELECT count(*) FROM entity_runs a JOIN entity_runs b ON a.id < b.id AND a.tool = b.tool
              AND a.started_at < b.ended_at AND b.started_at < a.ended_at WHERE a.tool = %s {same}"""


@pytest.fixture
def webs(transactional_db):
    with connection.cursor() as cursor:
        cursor.execute(RUNS_TABLE)
        cursor.execute("TRUNCATE entity_runs")  # not a model: transactional_db does not empty it
    env = {"IDEMOPS_TOOL_MODULES": "tests.support.entity_tools", "IDEMOPS_CONCURRENCY_WAIT_SECONDS": "1",
           "IDEMOPS_IN_PROGRESS_RETRY_AFTER_SECONDS": "0.2", "IDEMOPS_MCP_DB_THREADS": "8"}
    servers = []
    try:
        servers.append(WebServer("web-entity-a", **env))
        servers.append(WebServer("web-entity-b", **env))
        yield servers
    finally:
        for server in servers:
            server.stop(grace=3)


def _storm(webs, token: str, tool: str, accounts: list[str], per_account: int) -> list[Answer]:
    """Every call at once, spread over both web processes; each retried with its key until done."""
    answers: list[Answer] = []

    async def scenario():
        async with httpx2.AsyncClient(timeout=60) as client:
            deadline = time.monotonic() + 120
            calls = [call_until_done(client, webs[i % 2].mcp_url, token, tool,
                                     {"account": account, "hold_ms": 150, "idempotency_key": f"{tool}-{account}-{i}"},
                                     answers, deadline, max_pause=0.3)
                     for account in accounts for i in range(per_account)]
            await asyncio.gather(*calls)

    asyncio.run(scenario())
    return answers


def _count(sql: str, params) -> int:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchone()[0]


def test_a_storm_on_one_account_runs_one_at_a_time_and_a_waiting_call_hears_in_progress(webs, token):
    answers = _storm(webs, token, "debit_account", ["acct-1"], 12)

    # every operation ran once, never two at once
    assert _count("SELECT count(*) FROM entity_runs WHERE tool = 'debit_account'", []) == 12
    assert _count("SELECT count(DISTINCT key) FROM entity_runs WHERE tool = 'debit_account'", []) == 12
    assert _count(OVERLAPS.format(same="AND a.account = b.account"), ["debit_account"]) == 0
    # a call that waited out IDEMOPS_CONCURRENCY_WAIT_SECONDS heard in_progress, naming the entity and its
    # operation (the handle to ask again with), and nothing had been claimed for it
    waited = [answer for answer in answers if answer.error_class == "in_progress"]
    assert waited, "12 runs of 150 ms against a 1 s wait: some call must have waited it out"
    assert all(answer.error["concurrency_key"] == "account=acct-1" and answer.error.get("retry_after")
               for answer in waited)
    # the slots are gone once nothing runs
    assert _count("SELECT count(*) FROM tools_app_downstreamslot WHERE downstream LIKE 'entity:%%'", []) == 0


def test_many_accounts_run_in_parallel_each_one_at_a_time(webs, token):
    accounts = [f"acct-{n}" for n in range(6)]
    _storm(webs, token, "debit_account", accounts, 4)

    assert _count("SELECT count(*) FROM entity_runs WHERE tool = 'debit_account'", []) == 24
    assert _count(OVERLAPS.format(same="AND a.account = b.account"), ["debit_account"]) == 0
    # other accounts did run at the same time
    assert _count(OVERLAPS.format(same="AND a.account <> b.account"), ["debit_account"]) > 0


def test_without_the_key_the_same_storm_overlaps(webs, token):
    _storm(webs, token, "debit_account_unkeyed", ["acct-1"], 12)

    assert _count("SELECT count(*) FROM entity_runs WHERE tool = 'debit_account_unkeyed'", []) == 12
    assert _count(OVERLAPS.format(same="AND a.account = b.account"), ["debit_account_unkeyed"]) > 0
