"""The shared cache (Django's DatabaseCache): what one process keeps there, another reads. django-q2
keeps each cluster's heartbeat in it, so `qinfo`, `qmonitor` and the console see every cluster."""

from __future__ import annotations

import pytest
from django.db import connection
from django_q.status import Stat

from tests.support.processes import Worker
from tools_app.core import polling


@pytest.mark.django_db(transaction=True)
def test_qinfo_in_one_process_sees_a_cluster_started_in_another():
    cluster = Worker("qcluster-seen")
    try:
        seen: list[Stat] = []

        def cluster_seen() -> bool:
            seen[:] = [stat for stat in Stat.get_all() if stat.sentinel and stat.host]
            return any(stat.pid == cluster.process.pid for stat in seen)

        assert polling.until(cluster_seen, seconds=30, pause=0.2), [stat.pid for stat in seen]
    finally:
        cluster.stop()


def test_migrate_creates_the_cache_table(db):
    assert "idemops_cache" in connection.introspection.table_names()
