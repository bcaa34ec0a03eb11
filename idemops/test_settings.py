"""Settings for the test suite: a throwaway embedded cluster, never `make run`'s data.

pytest-django creates and drops the `test_idemops` database on it (one
server per pytest-xdist worker, under var/xdist-<worker>/). With
DATABASE_URL set, tests run against that server's `test_<name>` database.
"""

import os
from pathlib import Path

_var = Path(os.environ.get("IDEMOPS_VAR_DIR", Path(__file__).resolve().parent.parent / "var"))
# Under pytest-xdist (`make test` runs the suite on several workers) each worker has its own embedded
# server and local state, so that no worker's live processes, standby or pooler meet another's; the
# processes tests start inherit the directory.
# A worker inherits the controller's environment: IDEMOPS_PGDATA is set, not defaulted, and the URL of the
# controller's embedded server (which idemops.settings exports for child processes, marked by
# IDEMOPS_EMBEDDED_DATABASE) is dropped; a DATABASE_URL given by the person running the tests is kept.
if _worker := os.environ.get("PYTEST_XDIST_WORKER"):
    _var = _var / f"xdist-{_worker}"
    os.environ["IDEMOPS_VAR_DIR"] = str(_var)
    os.environ["IDEMOPS_PGDATA"] = str(_var / "test-pg")
    if os.environ.get("IDEMOPS_EMBEDDED_DATABASE", "").lower() in ("1", "true", "yes", "on"):
        del os.environ["IDEMOPS_EMBEDDED_DATABASE"]
        os.environ.pop("DATABASE_URL", None)
os.environ.setdefault("IDEMOPS_PGDATA", str(_var / "test-pg"))

from idemops.settings import *  # noqa: E402,F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast logins in tests
