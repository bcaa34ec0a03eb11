"""Django's PostgreSQL backend, with a health check that asks the server only when it must.

Django checks a persistent connection before its first query of each request (CONN_HEALTH_CHECKS,
on here): `SELECT 1`, one round trip per request, and per tool call over /mcp, whose database
threads keep their connections (tools_app/mcp/runtime.py). A connection the server closed (a
restart, `pg_terminate_backend`, an idle timeout) has sent its last message and the end of the
stream, so its socket reads as ready while nothing was asked; a live idle connection's does not.
So the check polls the socket (no round trip) and runs Django's own `SELECT 1` only when something
arrived unasked: a connection found broken is replaced before the call uses it, as before.
"""

from __future__ import annotations

import select

from django.db.backends.postgresql import base


class DatabaseWrapper(base.DatabaseWrapper):
    def is_usable(self) -> bool:
        connection = self.connection
        if connection is None or connection.closed or connection.broken:
            return False
        try:
            ready, _, _ = select.select([connection.fileno()], [], [], 0)
        except (OSError, ValueError):
            return False
        # Something arrived unasked: the server's goodbye (then SELECT 1 fails), or a notice or a
        # notification (then it answers, and the message is read).
        return super().is_usable() if ready else True
