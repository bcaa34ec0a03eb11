"""An operator's pause over real HTTP: a paused tool answers `transient` with retry_after and the
operator's reason to an agent calling through /mcp with the SDK's client, nothing runs and no run is
counted; after the resume the same key runs."""

import time

import pytest
from django.contrib.auth.models import User
from django.urls import reverse

from idemops_demo.models import Order
from tests.support.mcp_client import call_sync, error_of
from tests.support.operators import PASSWORD, VerifiedClient
from tools_app.models import AuditEvent, IdempotencyRecord

pytestmark = pytest.mark.live

ORDER = {"customer": "ACME", "items": [{"sku": "BOLT-1", "quantity": 3, "unit_price": "2.50"}], "currency": "EUR"}


def until(answer, done, ceiling=60.0):
    """Call `answer()` until `done(result)`: the web process re-reads the pauses within
    IDEMOPS_INCIDENT_STATE_SECONDS (a ceiling, not a pace)."""
    deadline = time.monotonic() + ceiling
    while True:
        result = answer()
        if done(result) or time.monotonic() > deadline:
            return result
        time.sleep(0.2)


def test_a_paused_tool_answers_transient_with_the_reason_over_mcp_runs_nothing_and_runs_after_the_resume(
        web_server, token):
    console = VerifiedClient()
    console.force_login(User.objects.create_superuser("root", password=PASSWORD))
    assert console.post(reverse("admin:tools_app_downstream_pause"), {
        "scope": "tool", "target": "create_order", "reason": "bad prices in the catalogue"}).status_code == 302
    # Other keys first, until the web process has read the pause: the key under test is never run before it.
    seen = until(lambda: call_sync(web_server.mcp_url, token, "create_order", {**ORDER, "idempotency_key": "warm"}),
                 lambda result: result.is_error)
    assert error_of(seen)["class"] == "transient"
    records_before, orders_before = IdempotencyRecord.objects.count(), Order.objects.count()

    paused = call_sync(web_server.mcp_url, token, "create_order", {**ORDER, "idempotency_key": "o-paused"})

    error = error_of(paused)
    assert error["class"] == "transient" and "bad prices in the catalogue" in error["message"]
    assert error["retry_after"] > 0
    assert IdempotencyRecord.objects.count() == records_before  # no record for o-paused: no run, none counted
    assert Order.objects.count() == orders_before

    pause = console.get(reverse("admin:tools_app_downstream_changelist")).context["pauses"][0][0]
    assert console.post(reverse("admin:tools_app_downstream_resume", args=[pause.pk]), {"reason": "fixed"}
                        ).status_code == 302
    ran = until(lambda: call_sync(web_server.mcp_url, token, "create_order", {**ORDER, "idempotency_key": "o-paused"}),
                lambda result: not result.is_error)

    assert not ran.is_error and ran.structured_content["idempotency"]["replayed"] is False
    assert IdempotencyRecord.objects.count() == records_before + 1 and Order.objects.count() == orders_before + 1
    assert AuditEvent.objects.filter(action__in=["pause.started", "pause.ended"]).count() == 2
