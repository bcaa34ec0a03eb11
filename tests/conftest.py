import pytest

from tests.task_stack import doc_dir, doc_server, settle_tasks, task_web, task_workers  # noqa: F401  (long tasks)
from tools_app import tenants
from tools_app.calls import Caller


@pytest.fixture
def tenant(db):
    return tenants.create_tenant("acme", "ACME")


@pytest.fixture
def other_tenant(db):
    return tenants.create_tenant("globex", "Globex")


@pytest.fixture
def caller(tenant):
    return Caller(tenant_id=tenant.pk, actor="agent:acme/test")


@pytest.fixture(scope="session")
def web_server(django_db_setup, django_db_blocker):
    """uvicorn serving idemops.asgi against the test database, for the whole session."""
    from tests.processes import WebServer

    with django_db_blocker.unblock():
        server = WebServer()
    yield server
    server.stop()


@pytest.fixture
def token(transactional_db):
    """A committed tenant `acme` and its raw API token (for the live server)."""
    tenant = tenants.create_tenant("acme", "ACME")
    _, raw = tenants.issue_token(tenant, "agent")
    return raw


@pytest.fixture
def other_token(transactional_db):
    tenant = tenants.create_tenant("globex", "Globex")
    _, raw = tenants.issue_token(tenant, "agent")
    return raw
