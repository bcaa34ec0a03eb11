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

from tests.support.api_support import make_event
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
    from tools_app.conf import override_conf

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


def test_creating_a_month_gives_up_on_a_reader_holding_the_table_and_the_next_run_creates_it():
    import psycopg

    from tests.support.processes import test_database_url

    this_month = audit_partitions.month_start(timezone.now())
    wanted = [name for name in months_from(this_month, 6) if name not in names()]
    # given: a long reader of the audit table (an export, say), in a session of its own
    with psycopg.connect(test_database_url()) as reader:
        reader.execute("SELECT count(*) FROM tools_app_auditevent").fetchone()
        # when: the job wants months that do not exist yet
        held = audit_partitions.ensure(months_ahead=5)
        reader.rollback()
    again = audit_partitions.ensure(months_ahead=5)

    # then: it waited no more than its lock timeout and created nothing; the next run created them
    assert (held.created, held.busy) == ([], wanted) and wanted
    assert again.created == wanted and set(wanted) <= set(names())


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


# --- upgrading: migration 0011 on a database that already holds events ----------------------------------------


def migrate(url: str, *target: str) -> None:
    import subprocess
    import sys

    from tests.support.processes import ROOT, child_env

    done = subprocess.run([sys.executable, "manage.py", "migrate", *target, "-v0"], cwd=ROOT,
                          env=child_env(DATABASE_URL=url), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.django_db(transaction=True)
def test_upgrading_moves_every_event_into_its_months_partition_and_keeps_ids_seals_and_guard():
    import psycopg

    from tests.platform.conftest import database_url
    from tests.support.processes import drop_database, service_database_url

    name = "audit_upgrade"
    drop_database(name)
    with psycopg.connect(service_database_url("postgres"), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = database_url(name)
    try:
        # given: a database migrated back to 0010 (unpartitioned) with 90 events over three months, half sealed
        migrate(url)
        migrate(url, "tools_app", "0010")
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO tools_app_auditevent (actor, action, object_type, object_id, reason, trace_id, "
                "created_at, prev_hash, hash) SELECT 'system:test', 'test.event', 'thing', g::text, '', '', "
                "date_trunc('month', now()) - interval '2 months' + (g || ' days')::interval, '', '' "
                "FROM generate_series(0, 89) g")
            before = conn.execute("SELECT id, object_id, created_at FROM tools_app_auditevent ORDER BY id").fetchall()
            conn.execute("UPDATE tools_app_auditevent SET seq = id, prev_hash = 'p', hash = 'h' WHERE id <= 45")
            sealed_before = conn.execute("SELECT count(*) FROM tools_app_auditevent WHERE seq IS NOT NULL").fetchone()

        # when: it migrates to 0011
        migrate(url, "tools_app", "0011")

        with psycopg.connect(url, autocommit=True) as conn:
            after = conn.execute("SELECT id, object_id, created_at FROM tools_app_auditevent ORDER BY id").fetchall()
            stored = dict(conn.execute("SELECT tableoid::regclass::text, count(*) FROM tools_app_auditevent "
                                       "GROUP BY 1").fetchall())
            sealed_after = conn.execute("SELECT count(*) FROM tools_app_auditevent WHERE seq IS NOT NULL").fetchone()
            new_id = conn.execute(
                "INSERT INTO tools_app_auditevent (actor, action, object_type, object_id, reason, trace_id, "
                "created_at, prev_hash, hash) VALUES ('system:test', 'test.event', 'thing', 'new', '', '', now(), "
                "'', '') RETURNING id").fetchone()[0]
            with pytest.raises(psycopg.errors.InsufficientPrivilege):  # the append-only guard came across
                conn.execute("DELETE FROM tools_app_auditevent WHERE object_id = 'new'")

        # then: every event is there, by the same id, in its month's partition; sealed ones still sealed;
        # new ids continue after the old ones
        assert after == before
        assert sealed_after == sealed_before
        assert audit_partitions.DEFAULT not in stored and sum(stored.values()) == len(before)
        months = {audit_partitions.month_name(audit_partitions.month_start(created)) for _, _, created in before}
        assert set(stored) == months and len(months) == 3
        assert new_id > before[-1][0]
    finally:
        drop_database(name)
