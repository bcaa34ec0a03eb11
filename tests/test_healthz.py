import pytest


@pytest.mark.django_db
def test_it_reports_database_and_queue(client):
    response = client.get("/healthz")

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
        response = client.get("/healthz")
    finally:
        connection.close()
        connection.settings_dict["NAME"] = original

    assert response.status_code == 503 and int(response["Retry-After"]) >= 1
    assert response.json()["checks"]["database"]["ok"] is False
