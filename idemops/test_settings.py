"""Settings for the test suite: a throwaway embedded cluster, never `make run`'s data.

pytest-django creates and drops the `test_idemops` database on it. With
DATABASE_URL set, tests run against that server's `test_<name>` database.
"""

import os
from pathlib import Path

_var = Path(os.environ.get("IDEMOPS_VAR_DIR", Path(__file__).resolve().parent.parent / "var"))
os.environ.setdefault("IDEMOPS_PGDATA", str(_var / "test-pg"))

from idemops.settings import *  # noqa: E402,F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast logins in tests
