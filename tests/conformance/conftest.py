import pytest


@pytest.fixture(scope="package")
def conformance_web(django_db_setup, django_db_blocker, _gateway, _sink):
    """uvicorn for the suites: the test downstreams, and a long tool called directly answers at once."""
    from tests.processes import WebServer, downstream_env

    with django_db_blocker.unblock():
        server = WebServer(name="web-conformance", **downstream_env(
            _gateway, _sink, IDEMOPS_TASK_CALL_WAIT_SECONDS="0"))
    yield server
    server.stop()
