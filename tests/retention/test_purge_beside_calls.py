"""The purge forgets what is kept only for a while beside calls: the end users' confirmation questions
once their deadline passed (each holds its call's raw key and the words its person was shown; an answer
to one is refused by then), and events sent to waiting tasks once older than tasks are kept."""

from datetime import timedelta

from tools_app import retention
from tools_app.approvals.confirmations import Confirmation
from tools_app.core import clock

CANARY = "cnry5b2d1a"


def question(tenant, key: str, expires_in: timedelta) -> Confirmation:
    now = clock.read()
    return Confirmation.objects.create(tenant=tenant, actor="agent:acme/test", tool="delete_record", key=key,
                                       fingerprint="f" * 64, summary=f"Delete the record of {CANARY}",
                                       created_at=now - timedelta(minutes=20), expires_at=now + expires_in)


def test_a_question_past_its_deadline_is_deleted_and_one_still_open_is_kept(transactional_db, tenant):
    question(tenant, f"del-{CANARY}-1", timedelta(minutes=-1))
    kept = question(tenant, "del-2", timedelta(minutes=9))

    report = retention.purge()

    assert report.purged["confirmations"] == 1
    assert list(Confirmation.objects.values_list("pk", flat=True)) == [kept.pk]
    assert not Confirmation.objects.filter(key__contains=CANARY).exists()


def test_events_sent_to_tasks_are_deleted_once_older_than_tasks_are_kept(transactional_db, tenant):
    from tools_app.conf import conf
    from tools_app.tasks.models import TaskEvent

    now = clock.read()
    kept_for = timedelta(hours=conf().retention_tasks_hours)
    TaskEvent.objects.create(tenant=tenant, event="gateway.callback", key="old", payload={"payee": CANARY},
                             received_at=now - kept_for - timedelta(minutes=1))
    TaskEvent.objects.create(tenant=tenant, event="gateway.callback", key="new", payload={"payee": "x"},
                             received_at=now - timedelta(minutes=1))

    report = retention.purge()

    assert report.purged["task_events"] == 1
    assert list(TaskEvent.objects.values_list("key", flat=True)) == ["new"]
