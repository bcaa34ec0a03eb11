"""Contract test: schemathesis fuzzes every operation of our own OpenAPI schema on a live server.

It runs as its own process, like a third-party client: it reads /api/schema/,
generates valid and invalid inputs for every parameter, and checks each
answer. The test fails on any 5xx, undocumented status code, content type or
header, or a body that breaks the schema.
"""

import subprocess
import sys

import pytest

from tools_app import auditors, tenants
from tools_app.calls import Caller, call_tool
from tools_app.registry import get_tool

pytestmark = pytest.mark.live

CHECKS = ",".join([
    "not_a_server_error", "status_code_conformance", "content_type_conformance", "response_headers_conformance",
    "response_schema_conformance",
])


def given_real_records():
    """Records and audit events of two tenants, made through the engine, including a failure."""
    acme = tenants.create_tenant("acme", "ACME")
    globex = tenants.create_tenant("globex", "Globex")
    order = {"customer": "ACME", "currency": "EUR", "items": [{"sku": "B-1", "quantity": 1, "unit_price": "2"}]}
    for tenant in (acme, globex):
        caller = Caller(tenant_id=tenant.pk, actor=f"agent:{tenant.slug}/bot")
        for n in range(3):
            call_tool(get_tool("create_order"), caller, {**order, "idempotency_key": f"o-{n}"})
        call_tool(get_tool("create_order"), caller, {**order, "currency": "USD", "idempotency_key": "o-0"})
    return acme


def test_schemathesis_finds_no_server_error_and_no_response_breaking_the_schema(web_server, transactional_db,
                                                                                 tmp_path):
    acme = given_real_records()
    _, raw_key = auditors.issue_key("contract-test", [acme], actor="system:test")

    run = subprocess.run(
        [sys.executable, "-m", "schemathesis.cli", "run", f"{web_server.base_url}/api/schema/?format=json",
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
    assert "6 total" in run.stdout or "6 passed" in run.stdout, run.stdout[-5000:]
