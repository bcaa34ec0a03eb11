"""The connection health check (tools_app/core/postgresql): no round trip for a live connection, and a
connection the server closed is found and replaced before a query uses it; the same for a connection
Django's pool (IDEMOPS_DB_POOL_MAX_SIZE) hands out."""

from __future__ import annotations

import select
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from django.db import close_old_connections, connection, connections

from tests.support.task_stack import wait_until
from tools_app.core.postgresql.base import DatabaseWrapper


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


@contextmanager
def pooled() -> Iterator[DatabaseWrapper]:
    """A connection of this test database through a pool of one connection, as settings build it for
    IDEMOPS_DB_POOL_MAX_SIZE (health checks on, no persistent connections)."""
    settings = {**connection.settings_dict, "CONN_MAX_AGE": 0, "CONN_HEALTH_CHECKS": True,
                "OPTIONS": {**connection.settings_dict["OPTIONS"], "pool": {"min_size": 1, "max_size": 1}}}
    alias = f"pooled-{uuid.uuid4().hex[:6]}"
    wrapper = DatabaseWrapper(settings, alias)
    connections[alias] = wrapper  # django.contrib.postgres looks each new connection up by its alias
    try:
        yield wrapper
    finally:
        wrapper.close()
        wrapper.close_pool()
        del connections[alias]


def test_the_pool_hands_out_a_live_connection_again_without_asking_the_server(transactional_db):
    with pooled() as wrapper:
        with wrapper.cursor() as cursor:
            cursor.execute("SELECT 'before the check'")
        pid = wrapper.connection.info.backend_pid
        wrapper.close()  # as at the end of a request: back to the pool

        wrapper.ensure_connection()  # the next request takes it: the pool checks it first
        assert wrapper.connection.info.backend_pid == pid
        # psycopg_pool's own check sends an empty query, which pg_stat_activity would show instead.
        assert last_statement(pid) == "SELECT 'before the check'"


def test_a_pooled_connection_the_server_closed_is_replaced_before_the_next_query(transactional_db):
    with pooled() as wrapper:
        wrapper.ensure_connection()
        pooled_connection = wrapper.connection
        pid = pooled_connection.info.backend_pid
        wrapper.close()
        with other_connection() as other:
            other.execute("SELECT pg_terminate_backend(%s)", [pid])
        wait_until(lambda: select.select([pooled_connection.fileno()], [], [], 0)[0],
                   what="the server's goodbye on the pooled connection's socket")

        with wrapper.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            assert cursor.fetchone()[0] != pid
        assert pooled_connection.closed
