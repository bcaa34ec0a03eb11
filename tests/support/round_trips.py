"""How many times a piece of code waits for PostgreSQL, counted in libpq's own trace of the connection."""

import tempfile
from collections.abc import Callable

from django.db import connection
from psycopg.pq import Trace


def round_trips(call: Callable[[], object]) -> list[str]:
    """What `call()` sent PostgreSQL that waits for an answer, in order: "Query BEGIN", "Sync", …
    (libpq's trace: one line per message, `F` from the client, tab-separated)."""
    connection.ensure_connection()
    pgconn = connection.connection.pgconn
    with tempfile.TemporaryFile("w+") as trace:
        pgconn.trace(trace.fileno())
        pgconn.set_trace_flags(Trace.SUPPRESS_TIMESTAMPS)
        try:
            call()
        finally:
            pgconn.untrace()
        trace.seek(0)
        lines = [line.split("\t") for line in trace.read().splitlines()]
    return ["Query " + fields[3].strip(' "') if fields[2] == "Query" else "Sync"
            for fields in lines if fields[0] == "F" and fields[2] in ("Query", "Sync")]
