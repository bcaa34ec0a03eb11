"""Django's PostgreSQL backend, with a health check that asks the server only when it must, and connection
pools a forked process does not share (at the end of this module).

Django checks a persistent connection before its first query of each request (CONN_HEALTH_CHECKS,
on here): `SELECT 1`, one round trip per request, and per tool call over /mcp, whose database
threads keep their connections (tools_app/mcp/runtime.py). With a pool (IDEMOPS_DB_POOL_MAX_SIZE),
Django has psycopg_pool check each connection it hands out instead (`check_connection`: an empty
query, a round trip per request too). A connection the server closed (a restart,
`pg_terminate_backend`, an idle timeout) has sent its last message and the end of the stream, so
its socket reads as ready while nothing was asked; a live idle connection's does not. So both checks
poll the socket (no round trip) and ask the server, as Django and psycopg_pool would, only when
something arrived unasked: a connection found broken is replaced before the call uses it, as before.
"""

from __future__ import annotations

import os
import select
from typing import Any

import psycopg
from django.db.backends.postgresql import base
from psycopg_pool import ConnectionPool


def unasked(connection: psycopg.Connection[Any]) -> bool:
    """Whether something arrived on the connection's socket that nobody asked for (the server's goodbye,
    a notice, a notification), or it has no socket to poll: then only a round trip can tell."""
    if connection.closed or connection.broken:
        return True
    try:
        ready, _, _ = select.select([connection.fileno()], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(ready)


def check_pooled(connection: psycopg.Connection[Any]) -> None:
    """The pool's check of a connection it is about to hand out: psycopg_pool's own (it raises for a dead
    connection, which the pool then replaces) only when the socket says something arrived unasked."""
    if unasked(connection):
        ConnectionPool.check_connection(connection)


class DatabaseWrapper(base.DatabaseWrapper):
    def is_usable(self) -> bool:
        connection = self.connection
        if connection is None or connection.closed or connection.broken:
            return False
        # Something arrived unasked: the server's goodbye (then SELECT 1 fails), or a notice or a
        # notification (then it answers, and the message is read).
        return super().is_usable() if unasked(connection) else True

    def get_new_connection(self, conn_params: dict[str, Any]) -> psycopg.Connection[Any]:
        pool = self.pool
        # Django builds the pool with psycopg_pool's round-trip check when health checks are on (as they
        # are here), and takes no check of its own in OPTIONS["pool"]; the pool keeps it as `_check`
        # (psycopg-pool < 3.4, pyproject.toml; another name would leave psycopg_pool's check in place,
        # and tests/core/test_health_check.py would find its round trip).
        if pool is not None and getattr(pool, "_check", None) is ConnectionPool.check_connection:
            pool._check = check_pooled
        connection: psycopg.Connection[Any] = super().get_new_connection(conn_params)
        return connection


# A forked child (django-q2's cluster forks its workers, pusher and monitor) inherits its parent's pools,
# the sockets of their connections included: used from both processes, one connection's messages
# interleave ("the last operation didn't produce records"). django-q2 closes Django's connections before
# it forks, which hands a pooled one back to its pool, still open. So a child starts with no pool (the next
# connection it needs opens a pool of its own), and keeps its parent's pools referenced without using them:
# closing one, or letting it be collected, would end the parent's connections (libpq's goodbye goes out on
# the shared socket).
_parents_pools: list[dict[str, ConnectionPool]] = []


def _no_inherited_pool() -> None:
    # Django's registry of pools, by alias (not in django-stubs).
    _parents_pools.append(base.DatabaseWrapper._connection_pools)  # type: ignore[attr-defined]
    base.DatabaseWrapper._connection_pools = {}  # type: ignore[attr-defined]  # the same registry


os.register_at_fork(after_in_child=_no_inherited_pool)
