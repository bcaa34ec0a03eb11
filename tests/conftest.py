import os

import pytest

from tests.support.operators import VerifiedClient, agent_owner, make_operator
from tools_app import access
from tools_app.access.roles import APPROVER
from tools_app.conf import override_conf
from tools_app.toolkit.calls import Caller

# The servers the suite starts run the demo's tools without asking their user first (delete_record,
# publish_announcement and small payments declare it): the tests of other behaviour call them as before.
# tests/mcp/test_mcp_confirmation.py starts its server with confirmation on, as deployed by default.
os.environ.setdefault("IDEMOPS_MCP_USER_CONFIRMATION", "false")

# Fixtures kept beside the helpers they start: the long-task stack (doc_dir, doc_server, task_web,
# task_workers, settle_tasks) and the web and cluster with their own logs (observed).
pytest_plugins = ["tests.support.task_stack", "tests.support.observability_support"]


# Files that take minutes each (fresh virtualenvs, the quick run of every benchmark, the adoption tutorial, the
# API's fuzzing, the permission matrix, the docs' checks). Under pytest-xdist they are handed out first, so that
# no worker is left running one while the others idle (`make test` passes --no-loadscope-reorder, without which
# xdist orders files by their number of tests and a one-test benchmark file came last).
LONG_FILES_FIRST = (
    "tests/platform/test_package.py", "tests/deploy/test_bench_quick.py", "tests/platform/test_adopting.py",
    "tests/api/test_api_contract.py", "tests/admin/test_operator_permissions.py", "tests/deploy/test_docs_truth.py",
    "tests/incidents/test_outage_ends_by_itself.py", "tests/incidents/test_breaker_and_limits.py",
)


def pytest_collection_modifyitems(items):
    def rank(item) -> int:
        path = item.nodeid.split("::")[0]
        return LONG_FILES_FIRST.index(path) if path in LONG_FILES_FIRST else len(LONG_FILES_FIRST)

    items.sort(key=rank)  # stable: within a file, and for every other file, the order stays


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    """The run stops the embedded PostgreSQL servers it started: the one this process started when it read
    the settings (var/test-pg; a pytest-xdist worker's var/xdist-<worker>/test-pg, the controller's
    var/test-pg), once every fixture is torn down (trylast: after pytest's own sessionfinish). A server it
    found running is left alone (idemops.embedded_pg.started_here): another run, or a developer's shell,
    may be using it. Ten `make test` leave no server behind; `make db-stop` is for `make run`'s."""
    from django.db import connections

    from idemops import embedded_pg

    connections.close_all()
    for pgdata in reversed(embedded_pg.started_here):
        embedded_pg.stop(pgdata)


@pytest.fixture(scope="session", autouse=True)
def _counts_flushed_by_hand():
    """In this process, tests flush counts themselves (core.counters.flush): no background thread
    holding a connection to the test database, which could then not be dropped."""
    from tools_app.core import counters

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(counters, "_ensure_flusher", lambda: None)
        yield


@pytest.fixture(scope="session", autouse=True)
def _flush_retried_after_a_deadlock():
    """A transactional test's teardown TRUNCATEs every table while the module's live processes (job
    clusters sweeping every second, web servers) still write: PostgreSQL may break the resulting
    deadlock by failing the TRUNCATE. That is the clean-up losing a race, not the code under test: the
    flush is tried again, up to three times."""
    from django.db import OperationalError
    from django.db.backends.base.operations import BaseDatabaseOperations

    flush = BaseDatabaseOperations.execute_sql_flush

    def flush_until_done(self, sql_list):
        for attempt in range(3):
            try:
                return flush(self, sql_list)
            except OperationalError as error:
                if "deadlock detected" not in str(error) or attempt == 2:
                    raise

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(BaseDatabaseOperations, "execute_sql_flush", flush_until_done)
        yield


@pytest.fixture(autouse=True)
def _no_counts_left_from_another_test():
    from tools_app.core import counters
    from tools_app.incidents import state

    counters._pending.clear()
    # This process's snapshot of pauses and breakers was read in another test's database state.
    state.forget()


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup, django_db_blocker):
    """pytest-django's test databases, and a key store as new as them: the key store (a database of its own,
    tools_app/core/keystore.py) is not one Django creates for a test run, so the last run's is dropped here."""
    from tools_app.core import keystore

    with django_db_blocker.unblock():
        keystore.drop_derived()
    return django_db_setup


@pytest.fixture
def client():
    """pytest-django's test client, whose force_login signs in with the authenticator code too
    (tests.support.operators.VerifiedClient; `force_login(user, second_factor=False)`: the password only)."""
    return VerifiedClient()


@pytest.fixture
def tenant(db):
    return access.create_tenant("acme", "ACME")


@pytest.fixture
def other_tenant(db):
    return access.create_tenant("globex", "Globex")


@pytest.fixture
def caller(tenant):
    return Caller(tenant_id=tenant.pk, actor="agent:acme/test")


@pytest.fixture(scope="session")
def _gateway(django_db_setup, django_db_blocker):
    from tests.support.processes import PaymentGateway

    with django_db_blocker.unblock():
        gateway = PaymentGateway()
    yield gateway
    gateway.stop()


@pytest.fixture(scope="session")
def _sink(django_db_setup, django_db_blocker):
    from tests.support.processes import NotificationSink

    with django_db_blocker.unblock():
        sink = NotificationSink()
    yield sink
    sink.stop()


@pytest.fixture
def gateway(_gateway):
    """The payment gateway process, emptied for this test."""
    _gateway.reset()
    return _gateway


@pytest.fixture
def sink(_sink):
    """The notification sink process, emptied for this test."""
    _sink.reset()
    return _sink


@pytest.fixture
def downstreams(gateway, sink, settings):
    """Both downstream systems; in-process code (tests, relay calls) is pointed at them too."""
    from tests.support.processes import downstream_env

    env = downstream_env(gateway, sink)
    override_conf(settings,
                  payment_gateway_url=gateway.url,
                  payment_gateway_timeout_seconds=1.0,
                  webhook_allowed_prefixes=[f"{sink.url}/webhooks/"])
    # Django's test set-up swaps in the in-memory mail backend; we want real SMTP.
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_PORT = sink.smtp_port
    return env


@pytest.fixture(scope="session")
def web_server(django_db_setup, django_db_blocker, _gateway, _sink):
    """uvicorn serving idemops.asgi against the test database and the test downstreams, for the session."""
    from tests.support.processes import WebServer, downstream_env

    with django_db_blocker.unblock():
        server = WebServer(**downstream_env(_gateway, _sink))
    yield server
    server.stop()


@pytest.fixture
def token(transactional_db):
    """A committed tenant `acme` and its raw API token (for the live server)."""
    tenant = access.create_tenant("acme", "ACME")
    _, raw = access.issue_token(tenant, "agent", owner=agent_owner())
    return raw


@pytest.fixture
def other_token(transactional_db):
    tenant = access.create_tenant("globex", "Globex")
    _, raw = access.issue_token(tenant, "agent", owner=agent_owner())
    return raw


@pytest.fixture
def approver(tenant):
    return make_operator("bob", APPROVER, tenant)


@pytest.fixture
def second_approver(tenant):
    return make_operator("carol", APPROVER, tenant)


@pytest.fixture
def fast(settings):
    """Long tasks that back off for milliseconds and calls that do not wait for them."""
    override_conf(settings, task_call_wait_seconds=0, task_backoff_base_seconds=0.01, task_backoff_max_seconds=0.05)
    return settings
