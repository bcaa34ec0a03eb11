"""The table the test tools of tests/support/entity_tools.py record their handler runs in (the account, the
database's time the run started and ended): made by the tests that count overlapping runs, which never
import the tools themselves (only the web processes they start do, by IDEMOPS_TOOL_MODULES)."""

RUNS_TABLE = """CREATE TABLE IF NOT EXISTS entity_runs (
    id bigserial PRIMARY KEY, tool text NOT NULL, account text NOT NULL, key text NOT NULL,
    started_at timestamptz NOT NULL, ended_at timestamptz NOT NULL)"""
