"""Contract test: schemathesis fuzzes every operation of our own OpenAPI schema on a live server.

It runs as its own process, like a third-party client: it reads /api/schema/,
generates valid and invalid inputs for every parameter, and checks each
answer. The test fails on any 5xx, undocumented status code, content type or
header, or a body that breaks the schema.
"""

import subprocess
import sys

import pytest

from tests.support.issued_ids import call_labelled
from tools_app.access import auditors, tenants
from tools_app.toolkit.calls import Caller, call_tool
from tools_app.toolkit.registry import get_tool

pytestmark = pytest.mark.live

CHECKS = ",".join([
    "not_a_server_error", "status_code_conformance", "content_type_conformance", "response_headers_conformance",
    "response_schema_conformance",
])


def given_real_records():
    """Records, audit events, outbox events and approval requests of two tenants, made through the tools."""
    acme = tenants.create_tenant("acme", "ACME")
    globex = tenants.create_tenant("globex", "Globex")
    order = {"customer": "ACME", "currency": "EUR", "items": [{"sku": "B-1", "quantity": 1, "unit_price": "2"}]}
    for tenant in (acme, globex):
        caller = Caller(tenant_id=tenant.pk, actor=f"agent:{tenant.slug}/bot")
        orders = [call_tool(get_tool("create_order"), caller, {**order, "idempotency_key": f"o-{n}"})
                  for n in range(3)]
        call_tool(get_tool("create_order"), caller, {**order, "currency": "USD", "idempotency_key": "o-0"})
        call_tool(get_tool("send_notification"), caller, {
            "channel": "email", "recipient": "ops@example.com", "subject": "s", "body": "b", "idempotency_key": "n"})
        call_labelled(caller, "delete_record", {
            "kind": "order", "id": orders[0].result["order_id"], "reason": "duplicate", "idempotency_key": "d"})
        call_tool(get_tool("start_task"), caller, {
            "tool": "ingest_document", "arguments": {"text": "A short note."}, "idempotency_key": "t"})
    return acme


def operation_count(schema_url: str) -> int:
    import httpx2

    paths = httpx2.get(schema_url).json()["paths"]
    return sum(len(operations) for operations in paths.values())


def test_schemathesis_finds_no_server_error_and_no_response_breaking_the_schema(web_server, transactional_db,
                                                                                 tmp_path):
    acme = given_real_records()
    _, raw_key = auditors.issue_key("contract-test", [acme], actor="system:test")

    schema_url = f"{web_server.base_url}/api/schema/?format=json"
    run = subprocess.run(
        [sys.executable, "-m", "schemathesis.cli", "run", schema_url,
         "--url", web_server.base_url,
         "--header", f"Authorization: Bearer {raw_key}",
         "--checks", CHECKS,
         "--mode", "all",
         "--phases", "examples,coverage,fuzzing",
         "--max-examples", "40",
         "--seed", "20261130",
         "--workers", "1",
         "--generation-database", "none",
         "--generation-with-security-parameters", "false",
         "--request-timeout", "30",
         "--no-color"],
        capture_output=True, text=True, timeout=900,
        cwd=tmp_path)  # schemathesis and hypothesis keep caches in the working directory

    assert run.returncode == 0, run.stdout[-15000:] + run.stderr[-3000:]
    operations = operation_count(schema_url)
    assert f"{operations} total" in run.stdout or f"{operations} passed" in run.stdout, run.stdout[-5000:]
