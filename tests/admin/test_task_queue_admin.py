"""The failed-or-stuck tasks queue in the admin."""

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from tests.support.api_support import make_record
from tests.support.operators import make_operator
from tools_app import access
from tools_app.access.roles import OPERATOR
from tools_app.models import Task, TaskStatus

pytestmark = pytest.mark.django_db
QUEUE = reverse("admin:tools_app_taskneedingattention_changelist")


def make_task(tenant, status, **fields):
    now = timezone.now()
    record = make_record(tenant, tool="ingest_document")
    return Task.objects.create(tenant=tenant, record=record, tool="ingest_document", arguments={},
                               input_digest="d" * 64, status=status, steps_total=6, max_attempts=5,
                               created_at=now, updated_at=now, **fields)


@pytest.fixture
def tasks_of_every_kind(tenant):
    past, future = timezone.now() - timedelta(minutes=5), timezone.now() + timedelta(minutes=5)
    return {
        "failed": make_task(tenant, TaskStatus.FAILED, failure_class="not_found"),
        "paused": make_task(tenant, TaskStatus.PAUSED, pause_reason="scanned PDF: needs its text"),
        "retrying": make_task(tenant, TaskStatus.RETRYING),
        "dead worker": make_task(tenant, TaskStatus.RUNNING, lease_owner="w1", lease_expires_at=past),
        "healthy": make_task(tenant, TaskStatus.RUNNING, lease_owner="w2", lease_expires_at=future),
        "done": make_task(tenant, TaskStatus.SUCCEEDED),
    }


def listed(client):
    response = client.get(QUEUE)
    assert response.status_code == 200
    return {str(pk) for pk in response.context["cl"].result_list.values_list("pk", flat=True)}


def test_the_queue_lists_failed_paused_retrying_and_dead_workers_tasks_only(client, tenant, tasks_of_every_kind):
    client.force_login(make_operator("ann", OPERATOR, tenant))

    shown = listed(client)

    expected = {"failed", "paused", "retrying", "dead worker"}
    assert shown == {str(t.pk) for name, t in tasks_of_every_kind.items() if name in expected}


def test_an_operator_of_another_tenant_sees_none_of_them(client, tasks_of_every_kind):
    client.force_login(make_operator("bob", OPERATOR, access.create_tenant("globex")))

    assert listed(client) == set()


def test_an_operator_cancels_a_task_from_the_queue_and_it_is_audited(client, tenant, tasks_of_every_kind):
    from tools_app.models import AuditEvent

    task = tasks_of_every_kind["paused"]
    client.force_login(make_operator("ann", OPERATOR, tenant))

    client.post(QUEUE, {"action": "cancel", "_selected_action": [task.pk], "confirm": "yes", "reason": "obsolete"})

    task.refresh_from_db()
    assert task.status == TaskStatus.CANCELLED
    assert AuditEvent.objects.filter(object_id=str(task.pk), actor="user:ann").exists()
    assert str(task.pk) not in listed(client)
