"""Test-only tools served by the web processes of tests/incidents/test_one_at_a_time.py (named in
IDEMOPS_TOOL_MODULES there, never imported by the test process itself).

Both record each run of their handler as a row of `entity_runs` (the account, the database's time
when the handler started and when it ended), so a test counts overlapping runs by counting rows.
`debit_account` declares the account as its concurrency key; `debit_account_unkeyed` is the same
tool without it: the same storm on it shows that the count does find overlaps.
"""

from __future__ import annotations

import time

from django.db import connection
from pydantic import BaseModel, Field

from idemops.tools import WriteInput, write_tool

# Its table, `entity_runs`, is made by the tests (tests/support/entity_runs.py: RUNS_TABLE).


class Debit(WriteInput):
    account: str = Field(max_length=50)
    hold_ms: int = Field(200, ge=0, le=5000)


class Debited(BaseModel):
    account: str


def _run(tool: str, args: Debit) -> Debited:
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        started = cursor.fetchone()[0]
        time.sleep(args.hold_ms / 1000)
        cursor.execute("INSERT INTO entity_runs (tool, account, key, started_at, ended_at) "
                       "VALUES (%s, %s, %s, %s, clock_timestamp())", [tool, args.account, args.idempotency_key,
                                                                       started])
    return Debited(account=args.account)


@write_tool(name="debit_account", title="Debit an account (test)",
            personal_fields=frozenset(), concurrency_key="account")
def debit_account(ctx, args: Debit) -> Debited:
    """Test tool: one debit of an account at a time."""
    return _run("debit_account", args)


@write_tool(name="debit_account_unkeyed", title="Debit an account, no key (test)", personal_fields=frozenset())
def debit_account_unkeyed(ctx, args: Debit) -> Debited:
    """Test tool: the same debit, without a concurrency key."""
    return _run("debit_account_unkeyed", args)
