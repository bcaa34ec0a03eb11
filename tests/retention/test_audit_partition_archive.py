"""Archiving with partitions (issue 28 §3): a past month whose events the archives all cover leaves the audit
table by a TRUNCATE of its partition, audited, and the kept chain still verifies from the archived head;
a month still holding a kept event keeps its rows; emptying a partition waits for neither the table's
writers nor the tenants' readers, and one that meets a reader inside the partition gives up after its lock
timeout, and the next purge empties it. What PostgreSQL holds is counted per partition.

The tests commit (transactional_db), as production does: PostgreSQL refuses to truncate a table its own
transaction has pending foreign-key checks on, which a test's single transaction would have."""

from datetime import timedelta
from pathlib import Path

import psycopg
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from tests.support.api_support import make_event
from tests.support.processes import test_database_url as database_url
from tools_app import retention
from tools_app.conf import override_conf
from tools_app.core import audit, audit_partitions
from tools_app.models import AuditArchive, AuditEvent, AuditRetention

OLD = timedelta(days=100)  # the old events' age: a month partition that ended before now
LATER = timedelta(days=40)  # the purge runs this long after now, so that this month's events expire too


@pytest.fixture
def archive_dir(settings, tmp_path):
    override_conf(settings, audit_archive_dir=tmp_path, audit_retention_days=30)
    return tmp_path


@pytest.fixture
def old_month():
    """The partition of the month OLD ago, created (the test database's partitions start at its creation);
    dropped again afterwards if a test left it behind committed."""
    start = audit_partitions.month_start(timezone.now() - OLD)
    audit_partitions.ensure(since=start)
    name = audit_partitions.month_name(start)
    yield name
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE IF EXISTS {name}")


def rows_in(name: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {name}")
        return cursor.fetchone()[0]


def purge_later() -> int:
    return retention.purge(now=timezone.now() + LATER).purged["audit_events"]


def test_a_past_month_wholly_archived_leaves_by_truncating_its_partition_and_the_kept_chain_verifies(
        transactional_db, archive_dir, tenant, old_month):
    AuditRetention.objects.create(tenant=tenant, keep_days=30)
    old = [make_event(tenant, created_at=timezone.now() - OLD, object_id=str(i)) for i in range(3)]
    audit.seal()
    head = audit.chain_head()

    archived = purge_later()

    # then: everything sealed was archived; the old month's partition was emptied, the rest deleted row by row
    assert archived == head[0]
    assert rows_in(old_month) == 0
    assert not AuditEvent.objects.filter(seq__lte=head[0]).exists()
    emptied = AuditEvent.objects.get(action="audit.partition_truncated", after__partition=old_month)
    newest = AuditArchive.objects.order_by("-last_seq").first()
    assert (emptied.object_type, emptied.object_id, emptied.actor) == ("auditarchive", str(newest.pk),
                                                                      "system:retention")
    assert emptied.after["partition"] == old_month and emptied.after["events"] == len(old)
    assert emptied.after["archived_up_to_seq"] == newest.last_seq
    # the archive files hold the truncated events, and what is kept verifies from the archived head
    files = [Path(archive.path) for archive in AuditArchive.objects.all()]
    assert all(retention.verify_archive_file(path).problem is None for path in files)
    in_files = sum(len(path.read_text().splitlines()) - 1 for path in files)
    assert in_files == head[0]
    audit.seal()
    assert audit.verify_chain().ok
    assert audit.verify_incrementally(every=10, full=True).ok


def test_a_month_still_holding_a_kept_event_keeps_its_partition(transactional_db, archive_dir, tenant, other_tenant,
                                                                 old_month):
    AuditRetention.objects.create(tenant=tenant, keep_days=30)
    AuditRetention.objects.create(tenant=other_tenant, keep_days=3650)
    make_event(tenant, created_at=timezone.now() - OLD)
    kept = make_event(other_tenant, created_at=timezone.now() - OLD)
    audit.seal()

    with CaptureQueriesContext(connection) as statements:
        purge_later()

    assert AuditEvent.objects.filter(pk=kept.pk).exists() and rows_in(old_month) >= 1
    assert not AuditEvent.objects.filter(action="audit.partition_truncated", after__partition=old_month).exists()
    newest = AuditArchive.objects.order_by("-last_seq").first()
    assert newest is not None  # what was archived before the kept event left the table all the same
    assert not AuditEvent.objects.filter(seq__lte=newest.last_seq).exists()
    assert audit.verify_chain().ok
    # and the kept month was told by its newest seq (its index), not counted: a purge reads no kept month whole
    read = [s["sql"] for s in statements.captured_queries if f"FROM {old_month}" in s["sql"]]
    assert read and not [sql for sql in read if "count(" in sql], read


def test_emptying_a_partition_that_meets_a_reader_in_it_waits_for_the_next_purge(
        transactional_db, archive_dir, tenant, old_month):
    AuditRetention.objects.create(tenant=tenant, keep_days=30)
    old = [make_event(tenant, created_at=timezone.now() - OLD, object_id=str(i)) for i in range(2)]
    audit.seal()

    # given: a long reader (an export, say) inside the old month's partition
    with psycopg.connect(database_url()) as reader:
        reader.execute(f"SELECT count(*) FROM {old_month}").fetchone()
        # when: the purge runs
        purge_later()
        # then: the partition is left whole (not emptied row by row) for the next purge; the rest went
        assert rows_in(old_month) == len(old)
        assert AuditEvent.objects.filter(pk__in=[event.pk for event in old]).count() == len(old)
        assert not AuditEvent.objects.filter(action="audit.partition_truncated", after__partition=old_month).exists()
        reader.rollback()

    # and: the next purge, with no reader, empties it
    purge_later()
    assert rows_in(old_month) == 0
    emptied = AuditEvent.objects.get(action="audit.partition_truncated", after__partition=old_month)
    assert emptied.after["events"] == len(old)
    audit.seal()
    assert audit.verify_chain().ok


def test_emptying_a_partition_waits_for_neither_the_tables_writers_nor_the_tenants_readers(
        transactional_db, archive_dir, tenant, old_month):
    AuditRetention.objects.create(tenant=tenant, keep_days=30)
    old = [make_event(tenant, created_at=timezone.now() - OLD, object_id=str(i)) for i in range(2)]
    audit.seal()

    # given: a transaction that has read the tenants and is writing an audit event of this month, uncommitted
    with psycopg.connect(database_url()) as other:
        other.execute("SELECT count(*) FROM tools_app_tenant").fetchone()
        other.execute("INSERT INTO tools_app_auditevent (tenant_id, actor, action, object_type, object_id, reason, "
                      "trace_id, created_at, prev_hash, hash) VALUES (%s, 'agent:acme/bot', 'test.event', 'thing', "
                      "'1', '', '', now(), '', '')", [tenant.pk])
        # when: the purge runs meanwhile
        purge_later()
        # then: the old month was emptied at once (no lock timeout), the other transaction untouched
        assert rows_in(old_month) == 0
        emptied = AuditEvent.objects.get(action="audit.partition_truncated", after__partition=old_month)
        assert emptied.after["events"] == len(old)
        other.commit()
    assert AuditEvent.objects.filter(action="test.event").count() == 1
