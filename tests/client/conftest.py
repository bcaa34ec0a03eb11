"""Live stacks for the client's tests: the real server, and the fault proxy of the client package in front of it."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def full_stack(django_db_setup, django_db_blocker, _gateway, _sink, doc_dir, doc_server):
    """uvicorn with the downstream services, and a django-q2 cluster for long tasks, for this module."""
    from tests.support.processes import WebServer, Worker, downstream_env
    from tests.support.task_stack import stack_env

    env = {**downstream_env(_gateway, _sink), **stack_env(doc_dir, doc_server)}
    with django_db_blocker.unblock():
        web = WebServer(name="web-client", **env)
        try:
            workers = Worker(name="workers-client", **env)
        except BaseException:
            web.stop()
            raise
    yield web
    workers.stop(grace=3)
    web.stop()
