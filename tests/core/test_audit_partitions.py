"""The audit table's monthly partitions (tools_app/core/audit_partitions.py, migration 0011): each event lands in
its month's partition, the months ahead are created by the job and the command, an event of a month without a
partition lands in the DEFAULT one rather than failing its write, and such a month is then reported, not
created. What PostgreSQL stores is read from its catalogue and from each row's tableoid."""

from datetime import UTC, datetime, timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.utils import timezone

from tests.api_support import make_event
from tools_app.core import audit, audit_partitions
from tools_app.core.jobs import create_audit_partitions
from tools_app.models import AuditEvent

pytestmark = pytest.mark.django_db


def stored_in(event: AuditEvent) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT tableoid::regclass::text FROM tools_app_auditevent WHERE id = %s", [event.pk])
        return cursor.fetchone()[0]


def months_from(start: datetime, count: int) -> list[str]:
    names, month = [], audit_partitions.month_start(start)
    for _ in range(count):
        names.append(audit_partitions.month_name(month))
        month = audit_partitions.next_month(month)
    return names


def names() -> list[str]:
    return [partition.name for partition in audit_partitions.partitions()]


def drop(name: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE {name}")


def test_the_audit_table_is_partitioned_by_month_and_an_event_lands_in_its_months_partition(tenant):
    with connection.cursor() as cursor:
        cursor.execute("SELECT partstrat FROM pg_partitioned_table WHERE partrelid = 'tools_app_auditevent'::regclass")
        assert cursor.fetchone() == ("r",)

    now = timezone.now()
    event = make_event(tenant, created_at=now)
    later = make_event(tenant, created_at=now + timedelta(days=40))

    assert stored_in(event) == audit_partitions.month_name(audit_partitions.month_start(now))
    assert stored_in(later) == audit_partitions.month_name(audit_partitions.month_start(now + timedelta(days=40)))
    # the chain does not care where rows are stored
    audit.seal()
    assert audit.verify_chain().ok


def test_the_job_creates_the_months_ahead_once(settings):
    from idemops.conf import override_conf

    override_conf(settings, audit_partition_months_ahead=5)
    this_month = audit_partitions.month_start(timezone.now())
    wanted = months_from(this_month, 6)
    drop(wanted[1])  # a gap, as after a job that did not run
    missing = [name for name in wanted if name not in names()]

    created = create_audit_partitions()

    assert wanted[1] in missing and created == missing  # the gap and the newly reached months
    assert set(wanted) <= set(names())
    assert create_audit_partitions() == []  # nothing twice
    assert names()[-1] == audit_partitions.DEFAULT


def test_an_event_of_a_month_without_a_partition_is_kept_in_the_default_one_and_that_month_is_reported(tenant):
    far = audit_partitions.month_start(audit_partitions.month_start(timezone.now()) + timedelta(days=800))
    event = make_event(tenant, created_at=far + timedelta(days=3))

    assert stored_in(event) == audit_partitions.DEFAULT
    this_month = audit_partitions.month_start(timezone.now())
    ensured = audit_partitions.ensure(months_ahead=(far.year - this_month.year) * 12 + far.month - this_month.month)
    # the months up to it are created; its own is not (PostgreSQL refuses a partition whose rows sit in DEFAULT)
    assert ensured.blocked == [audit_partitions.month_name(far)]
    assert audit_partitions.month_name(far) not in names()
    assert audit_partitions.month_name(audit_partitions.next_month(this_month)) in names()
    assert stored_in(event) == audit_partitions.DEFAULT


def test_the_command_creates_lists_and_fails_on_a_blocked_month(tenant):
    this_month = audit_partitions.month_start(timezone.now())
    drop(months_from(this_month, 3)[2])
    out = StringIO()

    call_command("audit_partitions", "--ahead", "2", stdout=out)

    lines = out.getvalue().splitlines()
    assert lines[0] == f"created {months_from(this_month, 3)[2]}"
    listed = {line.split()[0]: line for line in lines[1:]}
    assert set(listed) == set(names())
    current = months_from(this_month, 1)[0]
    count = AuditEvent.objects.filter(created_at__gte=this_month,
                                      created_at__lt=audit_partitions.next_month(this_month)).count()
    assert listed[current].endswith(f" {count} events") and count >= 1  # the tenant's creation, at least

    blocked_month = datetime(this_month.year + 5, 1, 1, tzinfo=UTC)
    make_event(tenant, created_at=blocked_month)
    with pytest.raises(CommandError, match=audit_partitions.month_name(blocked_month)):
        call_command("audit_partitions", "--ahead", str(12 * 5), stdout=StringIO())
    with pytest.raises(CommandError, match="0 or more"):
        call_command("audit_partitions", "--ahead", "-1", stdout=StringIO())
