"""The probes: /livez (the process answers), /readyz (the database and the job queue answer), and
/healthz, /readyz's older name."""

import sys

import httpx2
import pytest

from tests.support.processes import DatabaseServer, Service, child_env, free_port


@pytest.mark.django_db
@pytest.mark.parametrize("probe", ["/readyz", "/healthz"])
def test_readiness_reports_database_and_queue(client, probe):
    response = client.get(probe)

    assert response.status_code == 200
    body = response.json()
    assert body["checks"]["database"]["ok"] and body["checks"]["queue"]["ok"]


@pytest.mark.django_db
def test_it_answers_503_with_retry_after_when_the_database_is_unreachable(client, settings):
    from django.db import connection

    connection.close()
    original = connection.settings_dict["NAME"]
    connection.settings_dict["NAME"] = "no_such_database"
    try:
        response = client.get("/readyz")
        alive = client.get("/livez")
    finally:
        connection.close()
        connection.settings_dict["NAME"] = original

    assert response.status_code == 503 and int(response["Retry-After"]) >= 1
    assert response.json()["checks"]["database"]["ok"] is False
    assert alive.status_code == 200


@pytest.mark.live
def test_a_process_stays_live_while_it_is_not_ready_for_lack_of_its_queue_then_of_its_database(tmp_path):
    # A server of the test's own, never migrated: the database answers, django-q2's table does not.
    database = DatabaseServer(tmp_path / "pg")
    port = free_port()
    web = Service("web-probes", [sys.executable, "-m", "uvicorn", "idemops.asgi:application", "--host", "127.0.0.1",
                                 "--port", str(port), "--no-access-log"], child_env(DATABASE_URL=database.url))
    base = f"http://127.0.0.1:{port}"
    try:
        web.wait_http(f"{base}/livez")

        no_queue = httpx2.get(f"{base}/readyz", timeout=10)
        assert no_queue.status_code == 503 and int(no_queue.headers["Retry-After"]) >= 1
        assert no_queue.json()["reason"] == "unreachable: queue"
        assert no_queue.json()["checks"]["database"]["ok"] is True

        database.stop()
        no_database = httpx2.get(f"{base}/readyz", timeout=10)
        assert no_database.status_code == 503
        assert no_database.json()["reason"] == "unreachable: database, queue"
        assert httpx2.get(f"{base}/livez", timeout=10).json() == {"status": "ok"}
    finally:
        web.stop()
        database.stop()
