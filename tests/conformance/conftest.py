import subprocess

import pytest


@pytest.fixture(scope="package")
def conformance_web(django_db_setup, django_db_blocker, _gateway, _sink):
    """uvicorn for the suites: the test downstreams, and a long tool called directly answers at once."""
    from tests.support.processes import WebServer, downstream_env

    with django_db_blocker.unblock():
        server = WebServer(name="web-conformance", **downstream_env(
            _gateway, _sink, IDEMOPS_TASK_CALL_WAIT_SECONDS="0"))
    yield server
    server.stop()


@pytest.fixture(scope="package")
def interop():
    """tests/interop's pinned npm packages; `make test` installs them (npm ci), and so does this."""
    from tests.support.processes import ROOT

    folder = ROOT / "tests" / "interop"
    if not (folder / "node_modules" / "@modelcontextprotocol" / "conformance" / "package.json").exists():
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=folder, check=True, timeout=600)
    return folder


@pytest.fixture(scope="package")
def official_web(django_db_setup, django_db_blocker):
    """uvicorn for the official suite: the platform with the suite's test-only tools on (a setting production
    refuses), and no downstream systems (none of the suite's scenarios calls a platform tool)."""
    from tests.support.processes import WebServer

    with django_db_blocker.unblock():
        server = WebServer(name="web-official-conformance", IDEMOPS_CONFORMANCE_TEST_TOOLS="1")
    yield server
    server.stop()


@pytest.fixture
def bearer_proxy(official_web, token, interop):
    """The official suite sends no Authorization header: a proxy in front of /mcp adds the token."""
    proxy = subprocess.Popen(["node", "bearer_proxy.mjs", official_web.base_url, token], cwd=interop,
                             stdout=subprocess.PIPE, text=True)
    try:
        port = proxy.stdout.readline().strip()
        assert port.isdigit(), "the proxy did not start"
        yield f"http://localhost:{port}/mcp"
    finally:
        proxy.terminate()
        proxy.wait(10)
