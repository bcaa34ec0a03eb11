"""`manage.py serve` (`make run`) starts as many web workers and job clusters as it is told, and
stops every one of them."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import httpx2
import pytest

from tests.support.operators import agent_owner
from tests.support.processes import LOG_DIR, Service, child_env, free_port
from tests.support.task_stack import wait_until

pytestmark = pytest.mark.live


def children(pid: int) -> dict[int, str]:
    """pid -> command line of the processes whose parent is `pid`."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid:
                found[int(stat.parent.name)] = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, IndexError, ValueError):
            continue  # it exited while we looked
    return found


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_serve_starts_two_web_workers_and_two_job_clusters_and_stops_them_all(transactional_db, tmp_path):
    port = free_port()
    serve = Service("serve", [sys.executable, "manage.py", "serve", "--port", str(port)],
                    child_env(IDEMOPS_WEB_WORKERS="2", IDEMOPS_Q_CLUSTERS="2", IDEMOPS_Q_WORKERS="1",
                              IDEMOPS_RUN_DEMO_DOWNSTREAMS="false", IDEMOPS_VAR_DIR=str(tmp_path),
                              # the test database is not serve's to stop when it exits
                              IDEMOPS_EMBEDDED_DATABASE="false"))
    try:
        serve.wait_http(f"http://127.0.0.1:{port}/healthz", timeout=120)

        started = children(serve.process.pid)
        clusters = [pid for pid, argv in started.items() if argv.endswith("-m idemops qcluster ")]
        [web] = [pid for pid, argv in started.items() if "granian" in argv]
        assert len(clusters) == 2, started
        assert "--workers 2" in started[web]
        wait_until(lambda: len(children(web)) >= 2, what="granian's two workers")
        assert all(children(cluster) for cluster in clusters)  # each cluster has started its workers
    finally:
        serve.stop(grace=30)

    assert not [pid for pid in started if alive(pid)]
    # Nor anything a child started in its session (a granian worker outliving its master).
    assert not [pid for pid, argv in serving(port).items() if alive(pid)]


def serving(port: int) -> dict[int, str]:
    """pid -> command line of the processes whose command names `port`."""
    found = {}
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if f"--port {port} " in argv:
            found[int(cmdline.parent.name)] = argv
    return found


def demo_words() -> set[str]:
    """What only the demo says: its tools' names, its retention kinds, its objects, its settings' variables
    (read from its declarations, so a tool the demo gains is checked too)."""
    root = Path(__file__).resolve().parents[2] / "idemops_demo"
    tools = {name for source in (root / "tools").glob("*.py")
             for name in re.findall(r'\bname="([a-z_]+)"', source.read_text())}
    kinds = set(re.findall(r'register_retained\("([a-z_]+)"', (root / "apps.py").read_text()))
    variables = set(re.findall(r"^    ([a-z_]+): .*= setting\(", (root / "idemops_settings.py").read_text(), re.M))
    assert {"create_order", "ingest_document"} <= tools and kinds == {"documents"} and variables, (tools, kinds)
    return (tools | kinds | {f"IDEMOPS_{name.upper()}" for name in variables}
            | {"orders", "tickets", "announcements", "customers", "payment gateway", "notification sink"})


def said(words: set[str], text: str) -> list[str]:
    return sorted(word for word in words if re.search(rf"\b{re.escape(word)}\b", text))


def test_serve_with_the_demo_off_creates_no_demo_tenant_and_starts_no_demo_downstream(transactional_db, tmp_path):
    from tools_app import access
    from tools_app.access.models import Tenant

    port = free_port()
    serve = Service("serve-no-demo", [sys.executable, "manage.py", "serve", "--port", str(port)],
                    child_env(IDEMOPS_DEMO="false", IDEMOPS_Q_WORKERS="1", IDEMOPS_VAR_DIR=str(tmp_path),
                              IDEMOPS_EMBEDDED_DATABASE="false"))
    try:
        serve.wait_http(f"http://127.0.0.1:{port}/readyz", timeout=120)
        wait_until(lambda: "Ctrl-C stops everything" in serve.log_path.read_text(errors="replace"), what="the banner")

        started = children(serve.process.pid).values()
        assert not [argv for argv in started if "downstream." in argv], started
        assert any(argv.endswith("-m idemops qcluster ") for argv in started)
        assert not Tenant.objects.filter(slug="demo").exists()
        assert not (tmp_path / "demo-credentials.json").exists()

        # and no demo word is served or printed: tools/list over MCP, the banner, the settings doc
        tenant = access.create_tenant("acme", "ACME")
        _, token = access.issue_token(tenant, "agent", owner=agent_owner())
        listed = httpx2.post(f"http://127.0.0.1:{port}/mcp", timeout=30, json={
            "jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}, headers={
            "Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream"})
        assert listed.status_code == 200 and '"start_task"' in listed.text, listed.text[:500]
        banner = serve.log_path.read_text(errors="replace")
        assert "idemops is running" in banner
        doc = subprocess.run([sys.executable, "-m", "idemops.conf"], capture_output=True, text=True, check=True,
                             env=child_env(IDEMOPS_DEMO="false")).stdout
        assert "## Retention and purge" in doc
        words = demo_words()
        assert (said(words, listed.text), said(words, banner), said(words, doc)) == ([], [], [])
    finally:
        serve.stop(grace=30)


def test_a_service_that_never_answers_is_stopped_with_what_it_started_before_its_error_is_raised():
    # given a process, and a child of it in its session, that never serve HTTP
    (LOG_DIR / "never-ready.log").unlink(missing_ok=True)  # only this run's lines
    never = Service("never-ready", [sys.executable, "-c", (
        "import subprocess, sys, time; "
        "print(subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']).pid, flush=True); "
        "time.sleep(600)")], child_env())
    wait_until(lambda: never.log_path.read_text().strip(), what="the child's pid")
    child = int(never.log_path.read_text().split()[-1])

    # when its start-up is given up
    with pytest.raises(RuntimeError, match="not ready"):
        never.wait_http(f"http://127.0.0.1:{free_port()}/healthz", timeout=1)

    # then neither is left running to load the machine for the tests after (a fixture whose set-up
    # raised is never torn down)
    wait_until(lambda: not alive(never.process.pid) and not alive(child), timeout=10, what="both to be gone")
