"""The connection health check (tools_app/core/postgresql): no round trip for a live connection, and a
connection the server closed is found and replaced before a query uses it."""

from __future__ import annotations

import select

import psycopg
from django.db import close_old_connections, connection

from tests.support.task_stack import wait_until


def other_connection() -> psycopg.Connection:
    params = connection.get_connection_params()
    return psycopg.connect(**{k: v for k, v in params.items() if k in ("dbname", "user", "password", "host", "port")},
                           autocommit=True)


def last_statement(pid: int) -> str:
    with other_connection() as other:
        return other.execute("SELECT query FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone()[0]


def test_a_live_connection_passes_the_check_without_asking_the_server(transactional_db):
    with connection.cursor() as cursor:
        cursor.execute("SELECT 'before the check'")
    pid = connection.connection.info.backend_pid

    assert connection.is_usable()
    assert last_statement(pid) == "SELECT 'before the check'"  # no SELECT 1 reached it


def test_a_connection_the_server_closed_is_replaced_before_the_next_query(transactional_db):
    connection.ensure_connection()
    socket_ready = connection.connection.fileno()
    pid = connection.connection.info.backend_pid
    with other_connection() as other:
        other.execute("SELECT pg_terminate_backend(%s)", [pid])
    wait_until(lambda: select.select([socket_ready], [], [], 0)[0], what="the server's goodbye on the socket")

    assert not connection.is_usable()
    close_old_connections()  # as at the start of a request or an /mcp call: the next query checks first
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        assert cursor.fetchone()[0] != pid
