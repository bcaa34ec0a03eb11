"""Read replicas, with a real streaming standby of the test PostgreSQL (tests/support/standby.py).

A web process is given the standby as IDEMOPS_DATABASE_REPLICA_URLS. The standby logs every
statement it is sent, so each test reads there what reached it: the auditors' exports and the
console's evidence lists do, the calls' claims and the operators' queues never do, and while the
standby's replay is paused (it lags) it is skipped and the primary answers, with what only the
primary has yet.
"""

from __future__ import annotations

import csv
import io
import socket

import httpx2
import pytest
from django.contrib.auth import get_user_model

from tests.support.mcp_client import call_sync
from tests.support.operators import PASSWORD, admin_session, login_for_the_web_server
from tests.support.processes import WebServer
from tests.support.standby import Standby
from tests.support.task_stack import wait_until
from tools_app.access import auditors
from tools_app.models import AuditEvent, IdempotencyRecord, Tenant

pytestmark = pytest.mark.live

ORDER = {"customer": "ACME", "items": [{"sku": "BOLT-1", "quantity": 3, "unit_price": "2.50"}], "currency": "EUR"}
MAX_LAG_SECONDS = 1
RECORDS = '"tools_app_idempotencyrecord"'
RECORD_COUNT = "SELECT count(*) FROM tools_app_idempotencyrecord"


@pytest.fixture(scope="module")
def standby(django_db_setup, django_db_blocker):
    with django_db_blocker.unblock():
        server = Standby()
    yield server
    server.stop()


@pytest.fixture
def web(standby, token):
    standby.sql("SELECT pg_wal_replay_resume()")  # as a test that paused it may have left it
    server = WebServer("web-replica", IDEMOPS_DATABASE_REPLICA_URLS=standby.url,
                       IDEMOPS_DATABASE_REPLICA_MAX_LAG_SECONDS=str(MAX_LAG_SECONDS))
    yield server
    server.stop()


def export(web: WebServer, raw_key: str) -> list[dict[str, str]]:
    answer = httpx2.get(f"{web.base_url}/api/v1/idempotency-records/export.csv",
                        headers={"Authorization": f"Bearer {raw_key}"}, timeout=30)
    assert answer.status_code == 200, answer.text[:500]
    return list(csv.DictReader(io.StringIO(answer.text)))


def auditor_key() -> str:
    _, raw = auditors.issue_key("replica-auditor", [Tenant.objects.get(slug="acme")], actor="system:test")
    return raw


def order(web: WebServer, token: str, key: str) -> None:
    result = call_sync(web.mcp_url, token, "create_order", {**ORDER, "idempotency_key": key})
    assert not result.is_error, result.structured_content


def test_exports_evidence_lists_and_the_dashboard_are_read_from_the_standby_and_calls_decide_on_the_primary(
        standby, web, token):
    key = auditor_key()
    root = get_user_model().objects.create_superuser("root", "root@example.invalid", PASSWORD)
    login_for_the_web_server(root)

    # calls: claims, replays (a find-by-key before answering), completions: none reaches the standby
    calls = standby.mark()
    for name in ("r-1", "r-2", "r-1"):
        order(web, token, name)
    assert IdempotencyRecord.objects.count() == 2
    assert [s for s in standby.statements_since(calls) if "tools_app_" in s] == []

    # an auditor's export is read on the standby, once it has replayed the calls
    standby.replayed(RECORD_COUNT, 2)
    exporting = standby.mark()
    rows = export(web, key)
    assert sorted(row["tool"] for row in rows) == ["create_order", "create_order"]
    assert any(f"FROM {RECORDS}" in s for s in standby.statements_since(exporting))
    # who exported is audit data, written on the primary (a standby cannot take a write)
    assert AuditEvent.objects.filter(action="api.exported").count() == 1

    # the console: the records list reads the standby; the UNKNOWN queue, acted on, reads the primary
    session = admin_session(web, "root")
    listing = standby.mark()
    assert session.get("/admin/tools_app/idempotencyrecord/").status_code == 200
    assert any(f"FROM {RECORDS}" in s for s in standby.statements_since(listing))
    queue = standby.mark()
    assert session.get("/admin/tools_app/unknownoutcomequeue/").status_code == 200
    assert [s for s in standby.statements_since(queue) if "tools_app_" in s] == []
    # the dashboard and its trends read the standby
    dashboard = standby.mark()
    assert session.get("/admin/tools_app/dashboard/").status_code == 200
    assert any("tools_app_" in s for s in standby.statements_since(dashboard))


def test_a_standby_lagging_more_than_the_setting_is_skipped_and_the_primary_answers(standby, web, token):
    key = auditor_key()
    order(web, token, "before-pause")
    standby.replayed(RECORD_COUNT, 1)
    assert len(export(web, key)) == 1

    standby.sql("SELECT pg_wal_replay_pause()")
    order(web, token, "while-paused")
    wait_until(lambda: standby.lag_seconds() > MAX_LAG_SECONDS, what="the paused standby to lag")
    assert standby.sql(RECORD_COUNT)[0][0] == 1  # the standby does not have the new record

    skipped = standby.mark()
    rows = export(web, key)
    assert len(rows) == 2  # so the primary answered
    assert not any(f"FROM {RECORDS}" in s for s in standby.statements_since(skipped))

    # replay resumes: once caught up, the standby serves exports again
    standby.sql("SELECT pg_wal_replay_resume()")
    standby.replayed(RECORD_COUNT, 2)
    wait_until(lambda: standby.lag_seconds() <= MAX_LAG_SECONDS, what="the standby to catch up")
    back = standby.mark()
    wait_until(lambda: len(export(web, key)) == 2 and any(
        f"FROM {RECORDS}" in s for s in standby.statements_since(back)), what="an export read on the standby again")


def test_a_replica_that_accepts_connections_and_never_answers_is_skipped_after_its_connect_timeout(token):
    key = auditor_key()
    with socket.create_server(("127.0.0.1", 0), backlog=64) as silent:  # listens, never accepts nor answers
        host, port = silent.getsockname()
        server = WebServer("web-silent-replica", IDEMOPS_DATABASE_REPLICA_URLS=f"postgresql://idemops@{host}:{port}/x")
        try:
            # each export finds the replica unusable (connect_timeout, 2 s) and is answered by the primary
            for _ in range(2):
                assert export(server, key) == []
        finally:
            server.stop()
