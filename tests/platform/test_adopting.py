"""docs/adopting.md, followed as written, outside this repository.

Every fenced block the page marks `file=PATH` is written to PATH under a temporary directory (outside
the tree), and every `$ ` line of its `console` blocks is run there, in order, in a fresh virtualenv.
What differs from the page, and why:
- `pip install idemops` installs the wheel built from this tree (nothing is published from here);
- the exported DATABASE_URL, IDEMOPS_KEYSTORE_URL and the refunds API's address are this test's own (two
  databases of its own on the test server, a free port on 127.0.0.1), and `idemops serve` gets a free
  port (IDEMOPS_PORT);
  every other setting is the page's, the host names included: the test's requests reach 127.0.0.1 as
  the TLS proxy would, with `Host: tools.acme.example` and `X-Forwarded-Proto: https`, while `serve`'s
  own readiness check and the probes below call by address, as orchestrators do;
- the two commands that run servers (`refunds_api.py … &`, `idemops serve`) run in the background.
Then it calls the adopter's tools (not the demo's) over real MCP, as an agent would, and uses the
adopter's own table (its migration made as the page says, into the adopter's source tree).
"""

from __future__ import annotations

import asyncio
import base64
import os
import re
import shlex
import signal
import subprocess
import time
import zipfile
from pathlib import Path

import httpx2
import psycopg
import pytest
from django_otp.oath import TOTP
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.platform.conftest import database_url, run
from tests.support.mcp_client import error_of
from tests.support.processes import ROOT, drop_database, free_port, service_database_url

pytestmark = pytest.mark.live

PAGE = ROOT / "docs" / "adopting.md"
FENCE = re.compile(r"^```(?P<info>[^\n]*)\n(?P<body>.*?)^```$", re.M | re.S)
PUBLIC_HOST = "tools.acme.example"  # the page's IDEMOPS_ALLOWED_HOSTS, unchanged
# What the TLS proxy in front adds: the public host name the client asked for, and the scheme.
PROXY = {"Host": PUBLIC_HOST, "X-Forwarded-Proto": "https"}
TYPE_CHECK = "mypy --config-file acme-refunds/pyproject.toml acme-refunds/acme_refunds"
MIGRATION = Path("acme-refunds/acme_refunds/migrations/0001_initial.py")


def blocks() -> list[tuple[str, str]]:
    return [(m["info"].strip(), m["body"]) for m in FENCE.finditer(PAGE.read_text())]


def files() -> dict[str, str]:
    return {info.split("file=", 1)[1].split()[0]: body for info, body in blocks() if "file=" in info}


def commands() -> list[str]:
    return [line[2:] for info, body in blocks() if info == "console"
            for line in body.splitlines() if line.startswith("$ ")]


class Adopter:
    """The temporary directory, the virtualenv's environment, and the background processes the page starts."""

    def __init__(self, home: Path, wheel: Path, database_url: str, keystore_url: str):
        self.home, self.wheel = home, wheel
        self.port, self.api_port = free_port(), free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.api = f"http://127.0.0.1:{self.api_port}"
        # The test's own values for what the page exports (see the module's docstring): nothing else.
        self.own = {"DATABASE_URL": database_url, "IDEMOPS_KEYSTORE_URL": keystore_url, "ACME_REFUNDS_API": self.api}
        self.env: dict[str, str] = {}
        self.background: list[subprocess.Popen] = []
        self.outputs: dict[str, str] = {}

    def follow(self, command: str) -> None:
        if command.startswith("export "):
            name, value = command.removeprefix("export ").split("=", 1)
            self.env[name] = self.own.get(name, shlex.split(value)[0])
            return
        if command.startswith(". ") and command.endswith("/bin/activate"):
            venv = self.home / command.split()[1].removesuffix("/bin/activate")
            self.env.update(VIRTUAL_ENV=str(venv), PATH=f"{venv / 'bin'}:{os.environ['PATH']}")
            return
        if command == "pip install idemops":
            command = f"pip install --quiet {shlex.quote(str(self.wheel))}"
        elif command.startswith("pip install "):
            command += " --quiet"
        if command.endswith(" &") or command == "idemops serve":
            command = command.removesuffix(" &").replace(" 9000", f" {self.api_port}")
            log = open(self.home / f"{len(self.background)}.log", "ab")
            # `idemops serve` on this test's free port (the page leaves it at IDEMOPS_PORT's default).
            port = {"IDEMOPS_PORT": str(self.port)} if command == "idemops serve" else {}
            # Unbuffered, so that its log shows `serve`'s banner as soon as it is printed.
            port["PYTHONUNBUFFERED"] = "1"
            self.background.append(subprocess.Popen(["bash", "-c", f"exec {command}"], cwd=self.home,
                                                    env={**self.base_env(), **self.env, **port}, stdout=log,
                                                    stderr=subprocess.STDOUT, start_new_session=True))
            return
        self.outputs[command] = run(["bash", "-c", command], cwd=self.home, env={**self.env, **self.own_path()},
                                    timeout=900).stdout

    def base_env(self) -> dict[str, str]:
        return {k: v for k, v in os.environ.items()
                if k not in ("PYTHONPATH", "VIRTUAL_ENV", "DJANGO_SETTINGS_MODULE") and not k.startswith("IDEMOPS_")}

    def own_path(self) -> dict[str, str]:
        return {"PATH": self.env.get("PATH", os.environ["PATH"])}

    def token(self) -> str:
        printed = next(out for command, out in self.outputs.items() if command.startswith("idemops create_tenant"))
        return printed.strip().splitlines()[-1]

    def wait_ready(self, timeout: float = 180) -> None:
        """Until `idemops serve` says it runs (it does once its own check of /readyz, by address, answered)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for process in self.background:
                if process.poll() is not None:
                    raise AssertionError(f"a server the page starts exited:\n{self.logs()}")
            try:
                running = "idemops is running" in self.logs()
                if running and httpx2.get(f"{self.base}/readyz", timeout=2).status_code == 200:
                    return
            except httpx2.TransportError:
                pass
            time.sleep(0.3)
        raise AssertionError(f"/readyz never answered 200:\n{self.logs()}")

    def logs(self) -> str:
        return "\n".join(path.read_text()[-3000:] for path in sorted(self.home.glob("*.log")))

    def stop(self) -> None:
        for process in self.background:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in self.background:
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


@pytest.fixture
def adopter(wheel, tmp_path_factory, transactional_db):
    home = tmp_path_factory.mktemp("adopter")
    assert not home.is_relative_to(ROOT)
    database, keystore = "adopter_acme", "adopter_acme_keys"
    for name in (database, keystore):
        drop_database(name)
        with psycopg.connect(service_database_url("postgres"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
    adopter = Adopter(home, wheel, database_url(database), database_url(keystore))
    try:
        for path, body in files().items():
            (home / path).parent.mkdir(parents=True, exist_ok=True)
            (home / path).write_text(body)
        for command in commands():
            adopter.follow(command)
        adopter.wait_ready()
        yield adopter
    finally:
        adopter.stop()
        drop_database(database)
        drop_database(keystore)


async def _call(adopter: Adopter, token: str, tool: str, arguments: dict, timeout: float = 30):
    headers = {"Authorization": f"Bearer {token}", **PROXY}
    async with httpx2.AsyncClient(headers=headers, timeout=timeout) as http:
        async with Client(streamable_http_client(f"{adopter.base}/mcp", http_client=http), mode="legacy") as client:
            return await client.call_tool(tool, arguments)


def call(adopter: Adopter, token: str, tool: str, arguments: dict, timeout: float = 30):
    return asyncio.run(_call(adopter, token, tool, arguments, timeout))


def refunds(adopter: Adopter, currency: str) -> list[dict]:
    return httpx2.get(f"{adopter.api}/refunds", params={"currency": currency}, timeout=10).json()["refunds"]


def until(condition, what: str, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def sql(adopter: Adopter, query: str, params=()) -> list[tuple]:
    with psycopg.connect(adopter.own["DATABASE_URL"], autocommit=True) as conn:
        return conn.execute(query, params).fetchall()


def approve_in_the_console(adopter: Adopter, username: str, password: str, request_id: int) -> None:
    """A person logs in to the console and approves, as a browser behind the TLS proxy would: the
    session and CSRF cookies are Secure, so they are carried by hand over this plain-HTTP hop."""
    cookies: dict[str, str] = {}

    def send(method: str, path: str, **kwargs) -> httpx2.Response:
        headers = {**PROXY, "Referer": f"https://{PUBLIC_HOST}{path}",
                   "Cookie": "; ".join(f"{k}={v}" for k, v in cookies.items())}
        response = httpx2.request(method, f"{adopter.base}{path}", headers=headers, timeout=30, **kwargs)
        for header in response.headers.get_list("set-cookie"):
            name, value = header.split(";", 1)[0].split("=", 1)
            cookies[name] = value
        return response

    def csrf(page: httpx2.Response) -> str:
        return re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)

    login = send("GET", "/admin/login/")
    logged_in = send("POST", "/admin/login/", data={"username": username, "password": password,
                                                    "csrfmiddlewaretoken": csrf(login), "next": "/admin/"})
    assert logged_in.status_code == 302, logged_in.text[-2000:]
    # First time in: she enrols an authenticator (the page shows its secret), and enters its code.
    enrol = send("GET", "/admin/second-factor/")
    secret = re.search(r'id="totp-secret">([A-Z2-7=]+)<', enrol.text).group(1)
    code = f"{TOTP(base64.b32decode(secret)).token():06d}"
    entered = send("POST", "/admin/second-factor/", data={"code": code, "csrfmiddlewaretoken": csrf(enrol)})
    assert entered.status_code == 200 and 'id="recovery-codes"' in entered.text, entered.text[-2000:]
    queue = "/admin/tools_app/approvalqueue/"
    listed = send("GET", queue)
    assert f'value="{request_id}"' in listed.text
    approved = send("POST", queue, data={"action": "approve", "_selected_action": str(request_id), "index": "0",
                                         "confirm": "yes", "reason": "", "csrfmiddlewaretoken": csrf(listed)})
    assert approved.status_code == 302, approved.text[-2000:]


def test_the_tutorial_serves_the_adopters_own_tools_with_the_promise_kept(adopter):
    token = adopter.token()

    # with the page's host names: the probes answer by address, as the systemd sample's
    # `curl -fsS http://127.0.0.1:8000/livez` and a kubelet by pod IP call them; nothing else does
    for probe in ("/livez", "/readyz"):
        assert httpx2.get(f"{adopter.base}{probe}", timeout=10).status_code == 200
        assert httpx2.get(f"{adopter.base}{probe}", headers={"Host": "10.42.7.19:8000"}, timeout=10).status_code == 200
    by_address = {"X-Forwarded-Proto": "https"}
    assert httpx2.get(f"{adopter.base}/admin/login/", headers=by_address, timeout=10).status_code == 400
    assert httpx2.get(f"{adopter.base}/admin/login/", headers=PROXY, timeout=10).status_code == 200

    order = {"order_ref": "A-1001", "amount": "25.00", "currency": "EUR", "idempotency_key": "refund-A-1001"}

    # the adopter's tools are listed, and not the demo's
    listed = asyncio.run(_list_tools(adopter, token))
    assert {"issue_refund", "refund_report", "whoami"} <= listed and "create_order" not in listed

    # 50 identical concurrent calls: one refund, one answer for all
    async def storm():
        return await asyncio.gather(*(_call(adopter, token, "issue_refund", order) for _ in range(50)),
                                    return_exceptions=True)
    answers = asyncio.run(storm())
    assert [a for a in answers if isinstance(a, BaseException)] == []
    succeeded = [a for a in answers if not a.is_error]
    assert len(answers) == 50
    assert {a.structured_content["refund_id"] for a in succeeded} == {refunds(adopter, "EUR")[0]["refund_id"]}
    assert all(error_of(a)["class"] == "in_progress" for a in answers if a.is_error)
    assert len(refunds(adopter, "EUR")) == 1

    # a lost answer: the agent gives up waiting, the refund is made anyway; the retry gets it
    httpx2.post(f"{adopter.api}/control", json={"delay": 1.0}, timeout=10)
    lost = {**order, "order_ref": "A-1002", "idempotency_key": "refund-A-1002"}
    with pytest.raises(Exception):  # noqa: B017  (the client's own timeout, whichever form it takes)
        call(adopter, token, "issue_refund", lost, timeout=0.3)
    httpx2.post(f"{adopter.api}/control", json={"delay": 0}, timeout=10)
    retried = until(lambda: (r := call(adopter, token, "issue_refund", lost)) and not r.is_error and r,
                    what="the lost call's result")
    made = [r for r in refunds(adopter, "EUR") if r["order_ref"] == "A-1002"]
    assert len(made) == 1 and retried.structured_content["refund_id"] == made[0]["refund_id"]

    # a downstream timeout: UNKNOWN, then settled by the adopter's own reconciler (find_refund)
    httpx2.post(f"{adopter.api}/control", json={"delay": 3.0}, timeout=10)
    slow = {**order, "order_ref": "A-1003", "idempotency_key": "refund-A-1003"}
    unknown = call(adopter, token, "issue_refund", slow)
    assert error_of(unknown)["class"] == "unknown_outcome"
    httpx2.post(f"{adopter.api}/control", json={"delay": 0}, timeout=10)
    settled = until(lambda: (r := call(adopter, token, "issue_refund", slow)) and not r.is_error and r,
                    what="the reconciler to settle the refund")
    made = [r for r in refunds(adopter, "EUR") if r["order_ref"] == "A-1003"]
    assert len(made) == 1 and settled.structured_content["refund_id"] == made[0]["refund_id"]
    assert sql(adopter, "SELECT count(*) FROM tools_app_auditevent WHERE action = 'record.reconciled'")[0][0] >= 1

    # above 500: a person approves in the console, then it runs once
    large = {**order, "order_ref": "A-1004", "amount": "900.00", "idempotency_key": "refund-A-1004"}
    pending = error_of(call(adopter, token, "issue_refund", large))
    assert pending["class"] == "pending_approval" and not refunds_for(adopter, "A-1004")
    assert pending["approval"]["summary"] == "Refund 900.00 EUR on order A-1004"
    approve_in_the_console(adopter, "bea", "change-me-too", pending["approval"]["request_id"])
    approved = until(lambda: (r := call(adopter, token, "issue_refund", large)) and not r.is_error and r,
                     what="the approved refund")
    assert [r["refund_id"] for r in refunds_for(adopter, "A-1004")] == [approved.structured_content["refund_id"]]

    # the long tool: two checkpointed steps; the same call answers the task's handle until it ends, then the report
    report_call = {"currency": "EUR", "idempotency_key": "report-1"}
    report = until(lambda: (r := call(adopter, token, "refund_report", report_call)) and not r.is_error
                   and "refunds" in r.structured_content and r, what="the report")
    assert {key: report.structured_content[key] for key in ("refunds", "total")} == {"refunds": 4, "total": "975.00"}
    [(_, steps)] = sql(adopter, "SELECT t.id, count(c.id) FROM tools_app_task t JOIN tools_app_checkpoint c "
                                      "ON c.task_id = t.id WHERE t.tool = 'refund_report' GROUP BY t.id")
    assert steps == 2

    # the records, the audit events and the metrics are there
    assert sql(adopter, "SELECT count(*) FROM tools_app_idempotencyrecord WHERE tool = 'issue_refund' "
                        "AND status = 'succeeded'")[0][0] == 4
    assert sql(adopter, "SELECT count(*) FROM tools_app_auditevent WHERE action = 'record.claimed'")[0][0] >= 4
    metrics = httpx2.get(f"{adopter.base}/metrics", headers=PROXY, timeout=10).text
    assert re.search(r'idemops_tool_calls_total\{[^}]*tool="issue_refund"', metrics)

    # the app's own table: its migration was written into the adopter's source tree (not site-packages),
    # its tenant key is a foreign key to the platform's tenants, and a tenant's row moves the threshold
    migration = (adopter.home / MIGRATION).read_text()
    assert "to='tools_app.tenant'" in migration
    assert list(adopter.home.glob(".venv/lib/python*/site-packages/acme_refunds")) == []
    [(referenced,)] = sql(adopter, "SELECT confrelid::regclass::text FROM pg_constraint "
                                   "WHERE conrelid = 'acme_refunds_refundlimit'::regclass AND contype = 'f'")
    assert referenced == "tools_app_tenant"
    sql(adopter, "INSERT INTO acme_refunds_refundlimit (tenant_id, approval_above) "
                 "SELECT id, 50 FROM tools_app_tenant WHERE slug = 'acme' RETURNING id")
    held = {**order, "order_ref": "A-1005", "amount": "60.00", "idempotency_key": "refund-A-1005"}
    assert error_of(call(adopter, token, "issue_refund", held))["class"] == "pending_approval"
    assert refunds_for(adopter, "A-1005") == []
    below = {**order, "order_ref": "A-1006", "amount": "40.00", "idempotency_key": "refund-A-1006"}
    assert not call(adopter, token, "issue_refund", below).is_error and len(refunds_for(adopter, "A-1006")) == 1
    # ... and the package built from that tree carries the migration (the page's `packages.find`)
    run(["bash", "-c", "pip wheel --quiet --no-deps --wheel-dir built ./acme-refunds"], cwd=adopter.home,
        env={**adopter.env, **adopter.own_path()}, timeout=600)
    [built] = (adopter.home / "built").glob("acme_refunds-*.whl")
    assert "acme_refunds/migrations/0001_initial.py" in zipfile.ZipFile(built).namelist()

    # the page's type check passed on its app, models included; the same check catches a wrong declaration
    assert "Success: no issues found in 4 source files" in adopter.outputs[TYPE_CHECK]
    # ... a wrong argument
    said = type_errors(adopter, "personal_fields=frozenset(),", 'personal_fields=["order_ref"],')
    assert 'Argument "personal_fields" to' in said and 'expected "frozenset[str]"' in said, said
    # ... a handler reading another model than its approval rule (API 1.2: both typed over one input)
    said = type_errors(adopter, "def issue_refund(ctx: ToolContext, args: RefundInput)",
                       "def issue_refund(ctx: ToolContext, args: ReportInput)")
    assert 'incompatible type "Callable[[ToolContext, ReportInput], Refund]"' in said, said
    assert 'expected "Callable[[ToolContext, RefundInput], Refund]"' in said, said
    # ... a reconciler reading another model than the handler (API 2.1: a SentCall of the same input)
    said = type_errors(adopter, "def find_refund(call: SentCall[RefundInput])",
                       "def find_refund(call: SentCall[ReportInput])")
    assert '"ReportInput" has no attribute "order_ref"' in said, said
    assert 'incompatible type "Callable[[ToolContext, RefundInput], Refund]"' in said, said
    assert 'expected "Callable[[ToolContext, ReportInput], Refund]"' in said, said
    # ... and a long tool whose approval rule reads another model than its input_model (API 2.1)
    said = type_errors(adopter, "personal_fields=frozenset(),\n",
                       "personal_fields=frozenset(), approval=needs_approval,\n")
    assert ('Argument "approval" to "task_tool" has incompatible type "Callable[[Tenant, RefundInput], '
            'ApprovalPolicy | None]"') in said, said


def type_errors(adopter: Adopter, written: str, instead: str) -> str:
    """What the page's type check says of its tools module with the first `written` made `instead` (it must
    fail: the output is returned for the caller to read what it names)."""
    module = (adopter.home / "acme-refunds" / "acme_refunds" / "idemops_tools.py").read_text()
    changed = adopter.home / "changed_declaration.py"
    changed.write_text(module.replace(written, instead, 1))
    assert changed.read_text() != module, f"the page's tools module no longer says {written!r}"
    checked = run(["bash", "-c", f"mypy --config-file acme-refunds/pyproject.toml {changed}"],
                  cwd=adopter.home, env={**adopter.env, **adopter.own_path()}, timeout=600, check=False)
    assert checked.returncode == 1, checked.stdout
    return checked.stdout

def refunds_for(adopter: Adopter, order_ref: str) -> list[dict]:
    return [r for r in refunds(adopter, "EUR") if r["order_ref"] == order_ref]


async def _list_tools(adopter: Adopter, token: str) -> set[str]:
    headers = {"Authorization": f"Bearer {token}", **PROXY}
    async with httpx2.AsyncClient(headers=headers, timeout=30) as http:
        async with Client(streamable_http_client(f"{adopter.base}/mcp", http_client=http), mode="legacy") as client:
            return {tool.name for tool in (await client.list_tools()).tools}


def test_the_pages_code_blocks_are_what_the_test_writes():
    written = files()
    assert set(written) == {"acme-refunds/pyproject.toml", "acme-refunds/acme_refunds/__init__.py",
                            "acme-refunds/acme_refunds/apps.py", "acme-refunds/acme_refunds/models.py",
                            "acme-refunds/acme_refunds/idemops_tools.py", "acme-refunds/refunds_api.py"}
    assert "idemops serve" in commands() and "pip install idemops" in commands() and TYPE_CHECK in commands()
    # the migration is the page's to make, not a file it hands out
    assert str(MIGRATION) not in written and "idemops makemigrations acme_refunds" in commands()
    assert commands().index("idemops makemigrations acme_refunds") < commands().index("idemops migrate")
    # the host names are the page's production values, which the adopter test keeps
    assert f"export IDEMOPS_ALLOWED_HOSTS={PUBLIC_HOST}" in commands()
    compile(written["acme-refunds/acme_refunds/idemops_tools.py"], "idemops_tools.py", "exec")
    assert "3.11 to 3.13" in PAGE.read_text()
