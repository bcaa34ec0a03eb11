"""IDEMOPS_ENV=production: start-up refuses every default that is only safe on a laptop, naming the
variable, and Django's deployment checks find nothing to report.

Each test runs a real `manage.py check` (or a web server) with a crafted environment.
"""

from __future__ import annotations

import base64
import os
import secrets
import sys
import typing

import httpx2
import pytest

from tests.deploy.test_settings import problems, start
from tests.support import processes
from tests.support.processes import Service, free_port

PUBLIC_HOST = "idemops.example.com"


@pytest.fixture
def production(db) -> dict[str, str]:
    """A complete production environment, on the test database (migrated; this test's own rows unseen)."""
    return {"IDEMOPS_ENV": "production", "DATABASE_URL": processes.test_database_url(),
            "IDEMOPS_SECRET_KEY": secrets.token_urlsafe(50), "IDEMOPS_PUBLIC_URL": f"https://{PUBLIC_HOST}",
            "IDEMOPS_ALLOWED_HOSTS": PUBLIC_HOST, "IDEMOPS_MCP_ALLOWED_HOSTS": PUBLIC_HOST,
            "IDEMOPS_BEHIND_PROXY": "true", "IDEMOPS_KEK": base64.b64encode(os.urandom(32)).decode(),
            "IDEMOPS_KEYSTORE_URL": processes.test_database_url()}


def without(env: typing.Mapping[str, str], name: str) -> dict[str, str]:
    return {key: value for key, value in env.items() if key != name}


def test_a_complete_production_environment_passes_djangos_deployment_checks_with_nothing_to_report(production):
    process = start(["manage.py", "check", "--deploy", "--database", "default"], **production)

    assert process.returncode == 0, process.stderr
    assert "System check identified no issues (0 silenced)." in process.stdout, process.stdout + process.stderr
    assert "WARNING" not in process.stderr + process.stdout


def test_the_same_environment_in_development_leaves_the_deployment_warnings_production_mode_answers(production):
    process = start(["manage.py", "check", "--deploy"], **{**production, "IDEMOPS_ENV": "development"})

    for warning in ("security.W004", "security.W008", "security.W012", "security.W016"):  # HSTS, redirect, cookies
        assert warning in process.stderr + process.stdout


@pytest.mark.parametrize(("change", "line"), [
    ({"DATABASE_URL": None},
     "DATABASE_URL is not set: IDEMOPS_ENV=production never starts an embedded PostgreSQL server"),
    ({"IDEMOPS_EMBEDDED_DATABASE": "1"},
     "IDEMOPS_EMBEDDED_DATABASE is set: IDEMOPS_ENV=production never runs on an embedded PostgreSQL server"),
    ({"IDEMOPS_SECRET_KEY": None},
     "IDEMOPS_SECRET_KEY is not set: IDEMOPS_ENV=production does not generate one (every process must share it)"),
    ({"IDEMOPS_KEK": None},
     "IDEMOPS_KEK (or IDEMOPS_KEK_FILE) is not set: IDEMOPS_ENV=production never keeps the key-encryption key "
     "of personal values beside the data keys it wraps"),
    ({"IDEMOPS_KEK": "c2hvcnQ="},
     "IDEMOPS_KEK=<hidden>: value error, not 32 bytes in base64 (make one with: python -c 'import os, base64; "
     "print(base64.b64encode(os.urandom(32)).decode())'); expected text (secret)"),
    ({"IDEMOPS_KEYSTORE_URL": None},
     "IDEMOPS_KEYSTORE_URL is not set: IDEMOPS_ENV=production keeps the data keys of personal values in a "
     "database of their own"),
    ({"IDEMOPS_DEBUG": "true"}, "IDEMOPS_DEBUG is on: IDEMOPS_ENV=production never shows tracebacks"),
    ({"IDEMOPS_DEMO": "true"},
     "IDEMOPS_DEMO is on: IDEMOPS_ENV=production creates no demo tenant, people or token"),
    ({"IDEMOPS_PUBLIC_URL": f"http://{PUBLIC_HOST}"},
     f"IDEMOPS_PUBLIC_URL='http://{PUBLIC_HOST}' is not https://: IDEMOPS_ENV=production serves over TLS only"),
    ({"IDEMOPS_ALLOWED_HOSTS": None},
     "IDEMOPS_ALLOWED_HOSTS is the development default (localhost,127.0.0.1,[::1]): IDEMOPS_ENV=production "
     "needs the host names clients use"),
    ({"IDEMOPS_MCP_ALLOWED_HOSTS": None},
     "IDEMOPS_MCP_ALLOWED_HOSTS is the development default (localhost:*,127.0.0.1:*,[::1]:*,localhost,127.0.0.1): "
     "IDEMOPS_ENV=production needs the host names MCP clients use (any other Host header is refused)"),
    ({"IDEMOPS_CRASH_POINTS": "after_claim"},
     "IDEMOPS_CRASH_POINTS is set: IDEMOPS_ENV=production never kills itself for a test"),
    ({"IDEMOPS_CONFORMANCE_TEST_TOOLS": "true"},
     "IDEMOPS_CONFORMANCE_TEST_TOOLS is on: IDEMOPS_ENV=production serves no test-only tools"),
], ids=["no-database-url", "embedded-database", "no-secret-key", "no-kek", "malformed-kek", "no-keystore-url",
                                     "debug", "demo", "http-public-url",
        "default-allowed-hosts", "default-mcp-allowed-hosts", "crash-points", "conformance-test-tools"])
def test_production_refuses_each_unsafe_default_naming_its_variable(production, change, line):
    env = dict(production)
    for name, value in change.items():
        env = without(env, name) if value is None else {**env, name: value}
    if "DATABASE_URL" not in env:
        env["DATABASE_URL"] = ""  # start() sets one of its own; empty is unset

    assert problems(start(["manage.py", "check"], **env)) == [line]


def test_production_lists_every_problem_at_once():
    lines = problems(start(["manage.py", "check"], IDEMOPS_ENV="production", DATABASE_URL="", IDEMOPS_DEBUG="1",
                           IDEMOPS_DEMO="1"))

    assert [line.split(" ")[0].split("=")[0] for line in lines] == [
        "DATABASE_URL", "IDEMOPS_SECRET_KEY", "IDEMOPS_KEK", "IDEMOPS_KEYSTORE_URL", "IDEMOPS_DEBUG", "IDEMOPS_DEMO",
        "IDEMOPS_PUBLIC_URL", "IDEMOPS_ALLOWED_HOSTS", "IDEMOPS_MCP_ALLOWED_HOSTS"]


def test_the_demo_is_off_by_default_in_production_and_on_in_development(production):
    show = ["manage.py", "shell", "--no-imports", "-c", "from tools_app.conf import conf; print(conf().demo)"]

    assert start(show, **production).stdout.strip() == "False"
    assert start(show, **without(production, "IDEMOPS_ENV")).stdout.strip() == "True"


@pytest.fixture
def production_server(production):
    """A production web server on 127.0.0.1 whose ALLOWED_HOSTS is the public host name only."""
    port = free_port()
    web = Service("web-production", [sys.executable, "-m", "uvicorn", "idemops.asgi:application", "--host",
                                     "127.0.0.1", "--port", str(port), "--no-access-log"],
                  {**without(os.environ, "IDEMOPS_EMBEDDED_DATABASE"), "DJANGO_SETTINGS_MODULE": "idemops.settings",
                   **production})
    base = f"http://127.0.0.1:{port}"
    try:
        web.wait_http(f"{base}/livez")
        yield base
    finally:
        web.stop()


def test_a_production_server_redirects_browsers_to_https_but_answers_probes_in_plain_http(production_server):
    base = production_server
    public = {"Host": PUBLIC_HOST}
    assert httpx2.get(f"{base}/livez").status_code == 200
    assert httpx2.get(f"{base}/readyz").status_code == 200

    plain = httpx2.get(f"{base}/admin/login/", headers=public)
    assert plain.status_code == 301
    assert plain.headers["location"] == f"https://{PUBLIC_HOST}/admin/login/"

    # Behind the proxy (IDEMOPS_BEHIND_PROXY), a request it marks https is served, with HSTS and secure cookies.
    proxied = httpx2.get(f"{base}/admin/login/", headers={**public, "X-Forwarded-Proto": "https"})
    assert proxied.status_code == 200
    assert proxied.headers["strict-transport-security"] == "max-age=31536000; includeSubDomains; preload"
    assert "secure" in proxied.headers["set-cookie"].lower()


def test_the_probes_answer_by_address_whatever_the_host_while_every_other_path_keeps_the_host_check(
        production_server):
    base = production_server
    by_address = [base.removeprefix("http://"), "10.42.7.19:8000", "[fd00::17]:8000", "localhost"]  # loopback, pod IPs
    for host in by_address:
        for probe in ("/livez", "/readyz", "/healthz"):
            answer = httpx2.get(f"{base}{probe}", headers={"Host": host})
            assert (answer.status_code, answer.json()["status"]) == (200, "ok"), (probe, host, answer.text)

    for path in ("/admin/", "/admin/login/", "/api/", "/metrics", "/mcp/x", "/livez/", "/readyz/x"):
        for host in ("evil.example", *by_address):
            answer = httpx2.get(f"{base}{path}", headers={"Host": host, "X-Forwarded-Proto": "https"})
            assert answer.status_code == 400, (path, host, answer.status_code)
        # ... while the public host name reaches it (whatever the page then answers).
        public = httpx2.get(f"{base}{path}", headers={"Host": PUBLIC_HOST, "X-Forwarded-Proto": "https"})
        assert public.status_code != 400, (path, public.status_code)
