"""The web process `make run` starts (granian, two workers) serves the admin, /healthz and /mcp:
real MCP clients' calls reach the engine, a retry with the same key replays, and each request
has its access line, as fields like every log line."""

import json

import httpx2
import pytest

from idemops_demo.models import Order
from tests.support.mcp_client import call_sync
from tests.support.processes import LOG_DIR, Service, child_env, free_port
from tests.support.task_stack import wait_until
from tools_app.management.commands.serve import Command

pytestmark = pytest.mark.live

ORDER = {"customer": "ACME", "items": [{"sku": "BOLT-1", "quantity": 3, "unit_price": "2.50"}], "currency": "EUR"}


@pytest.fixture
def served():
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    (LOG_DIR / "serve-web.log").unlink(missing_ok=True)  # only this run's lines
    web = Service("serve-web", Command.web_argv("127.0.0.1", port, 2), child_env(IDEMOPS_PUBLIC_URL=base))
    web.wait_http(f"{base}/healthz")
    yield base, web
    web.stop()


def test_the_web_process_of_make_run_serves_mcp_calls_the_admin_and_health(served, token):
    served, web = served
    who = call_sync(f"{served}/mcp", token, "whoami", {})
    first = call_sync(f"{served}/mcp", token, "create_order", {**ORDER, "idempotency_key": "served-1"})
    again = call_sync(f"{served}/mcp", token, "create_order", {**ORDER, "idempotency_key": "served-1"})

    assert not who.is_error and who.structured_content["agent"].startswith("agent:acme/")
    assert not first.is_error and again.structured_content["idempotency"]["replayed"] is True
    assert again.structured_content["order_id"] == first.structured_content["order_id"]
    assert Order.objects.count() == 1
    assert httpx2.get(f"{served}/healthz").status_code == 200
    assert httpx2.get(f"{served}/admin/login/?next=/admin/").status_code == 200

    # A worker writes a request's access line after its answer is sent: wait for the lines (a
    # bounded wait for the condition, not a race with the worker), then stop as `make run` does.
    def requests():
        lines = [json.loads(line) for line in web.log_path.read_text().splitlines() if line.startswith("{")]
        return [line for line in lines if line.get("event") == "http.request"]

    wait_until(lambda: any(line["url_path"] == "/admin/login/" for line in requests()), timeout=30,
               what="the admin request's access line")  # the query is not logged
    Command().stop([("web", web.process)])
    assert {"method": "POST", "url_path": "/mcp", "status": 200} in [
        {key: line.get(key) for key in ("method", "url_path", "status")} for line in requests()]
