"""Retention of audit events: a per-tenant policy, audited; the purge archives an expired prefix of the chain to a
file, and what is kept still verifies from the archived head."""

import json
import threading
import time
from datetime import timedelta
from io import StringIO
from pathlib import Path

import psycopg
import pytest
from django.core.management import CommandError, call_command
from django.db import DatabaseError, transaction
from django.utils import timezone

from tests.core.test_audit_chain import sql, trigger_disabled
from tests.support.api_support import make_event
from tests.support.operators import make_operator
from tests.support.processes import test_database_url as database_url
from tools_app import access, retention
from tools_app.access.roles import OPERATOR
from tools_app.conf import override_conf
from tools_app.core import audit
from tools_app.core.errors import PermissionDenied
from tools_app.models import AuditArchive, AuditEvent, AuditRetention

LATER = timedelta(days=40)  # the purge runs this long after the events were written


@pytest.fixture
def archive_dir(settings, tmp_path):
    # Events of no tenant (the tenants' creation) follow the setting: 30 days, like the tenants below.
    override_conf(settings, audit_archive_dir=tmp_path, audit_retention_days=30)
    return tmp_path


def chain_of(*tenants):
    """Sealed events of the given tenants in this order, after the tenants' own creation events: seq → event."""
    for i, tenant in enumerate(tenants):
        make_event(tenant, object_id=str(i))
    audit.seal()
    return {event.seq: event for event in AuditEvent.objects.filter(seq__isnull=False)}


def purge_later():
    return retention.purge(now=timezone.now() + LATER).purged["audit_events"]


def keys_destroyed() -> int:
    """The `data_key.destroyed` events the purge wrote after the archiving: the data keys whose period ended that
    no row needs (the key store outlives each test's rolled-back rows, so earlier tests' keys count too)."""
    return AuditEvent.objects.filter(action="data_key.destroyed").count()


# --- the policy -----------------------------------------------------------------------------------


def test_changing_a_tenants_audit_retention_is_audited_with_the_days_before_and_after(transactional_db, tenant):
    operator = make_operator("olga", OPERATOR, tenant)
    retention.set_audit_retention(operator, tenant, 400)

    retention.set_audit_retention(operator, tenant, 3650)

    assert AuditRetention.objects.get(tenant=tenant).keep_days == 3650
    events = list(AuditEvent.objects.filter(action="retention.audit_changed").order_by("id"))
    assert [(e.actor, e.tenant_id, e.before, e.after) for e in events] == [
        ("user:olga", tenant.pk, None, {"keep_days": 400}),
        ("user:olga", tenant.pk, {"keep_days": 400}, {"keep_days": 3650})]


def test_an_operator_of_another_tenant_cannot_change_its_audit_retention(transactional_db, tenant, other_tenant):
    outsider = make_operator("otto", OPERATOR, other_tenant)

    with pytest.raises(PermissionDenied):
        retention.set_audit_retention(outsider, tenant, 1)

    assert not AuditRetention.objects.exists()
    assert AuditEvent.objects.filter(action="retention.change_refused").count() == 1


# --- the archive ----------------------------------------------------------------------------------


def test_the_purge_archives_expired_events_to_a_file_and_what_is_kept_still_verifies(db, archive_dir, tenant):
    AuditRetention.objects.create(tenant=tenant, keep_days=30)
    chain = chain_of(tenant, tenant, tenant)
    head = max(chain)

    archived = purge_later()

    archive = AuditArchive.objects.get()
    assert archived == head == archive.last_seq and archive.first_seq == 1
    assert not AuditEvent.objects.filter(seq__lte=head).exists()  # the rows are gone
    assert (archive.first_prev_hash, archive.last_hash) == (audit.GENESIS_HASH, chain[head].hash)
    lines = Path(archive.path).read_text().splitlines()
    header = json.loads(lines[0])
    assert (header["first_seq"], header["last_seq"], header["events"]) == (1, head, head) and len(lines) == head + 1
    assert (header["first_prev_hash"], header["last_hash"]) == (audit.GENESIS_HASH, chain[head].hash)
    check = retention.verify_archive_file(Path(archive.path))
    assert check.problem is None and check.events == head and check.last_hash == chain[head].hash
    # the archiving is audited; sealed, that event links to the archived head and the kept chain verifies
    audit.seal()
    kept = AuditEvent.objects.get(action="audit.archived")
    assert kept.seq == head + 1 and kept.prev_hash == chain[head].hash
    assert kept.after["file"] == Path(archive.path).name
    report = audit.verify_chain()
    assert report.ok and report.verified == 1 + keys_destroyed() and report.head_seq == head + 1 + keys_destroyed()
    assert audit.verify_incrementally(every=10, full=True).ok


def test_an_event_of_a_tenant_that_keeps_longer_stops_the_archive_there(db, archive_dir, tenant, other_tenant):
    AuditRetention.objects.create(tenant=tenant, keep_days=30)
    AuditRetention.objects.create(tenant=other_tenant, keep_days=365)
    chain = chain_of(tenant, other_tenant, tenant)
    first_kept = next(seq for seq, event in sorted(chain.items()) if event.tenant_id == other_tenant.pk)

    archived = purge_later()

    assert archived == first_kept - 1
    assert sorted(AuditEvent.objects.filter(seq__isnull=False).values_list("seq", flat=True))[0] == first_kept
    assert audit.verify_chain().ok


def test_without_a_retention_nothing_is_archived(db, settings, tmp_path, tenant):
    override_conf(settings, audit_archive_dir=tmp_path)  # IDEMOPS_AUDIT_RETENTION_DAYS=0: for ever
    chain = chain_of(tenant, tenant)

    assert purge_later() == 0

    assert AuditEvent.objects.filter(seq__isnull=False).count() == len(chain) and not AuditArchive.objects.exists()


def test_a_tampered_chain_is_not_archived(db, archive_dir, tenant):
    AuditRetention.objects.create(tenant=tenant, keep_days=30)
    chain = chain_of(tenant, tenant)
    with trigger_disabled():
        sql("UPDATE tools_app_auditevent SET reason = 'nothing to see' WHERE seq = 2")

    with pytest.raises(retention.ArchiveRefused, match="broken at seq 2"):
        purge_later()

    assert AuditEvent.objects.filter(seq__isnull=False).count() == len(chain) and not AuditArchive.objects.exists()
    assert list(archive_dir.iterdir()) == []


def test_an_event_edited_after_an_archive_is_still_found(db, archive_dir, tenant, other_tenant):
    AuditRetention.objects.create(tenant=tenant, keep_days=30)
    AuditRetention.objects.create(tenant=other_tenant, keep_days=365)
    chain = chain_of(tenant, other_tenant, other_tenant)
    purge_later()
    kept = sorted(AuditEvent.objects.filter(seq__isnull=False).values_list("seq", flat=True))
    with trigger_disabled():
        sql("UPDATE tools_app_auditevent SET actor = 'someone else' WHERE seq = %s", [kept[1]])

    broken = audit.verify_chain().broken

    assert broken.seq == kept[1] and "edited" in broken.problem and max(chain) == kept[-1]


def test_an_edited_archive_file_is_found(db, archive_dir, tenant):
    AuditRetention.objects.create(tenant=tenant, keep_days=30)
    chain_of(tenant, tenant, tenant)
    purge_later()
    path = Path(AuditArchive.objects.get().path)
    out = StringIO()
    call_command("verify_audit_log", "--archive", str(path), stdout=out)
    assert out.getvalue().startswith(f"OK: 4 archived events verified from {audit.GENESIS_HASH}")
    lines = path.read_text().splitlines()
    event = json.loads(lines[2])
    event["actor"] = "someone else"
    path.write_text("\n".join([*lines[:2], json.dumps(event), *lines[3:]]) + "\n")

    assert retention.verify_archive_file(path).problem == "seq 2 does not verify"
    with pytest.raises(CommandError, match="BROKEN archive .*seq 2 does not verify"):
        call_command("verify_audit_log", "--archive", str(path), stdout=StringIO())


def test_the_database_deletes_only_what_an_archive_covers(db, archive_dir, tenant, other_tenant):
    AuditRetention.objects.create(tenant=tenant, keep_days=30)
    AuditRetention.objects.create(tenant=other_tenant, keep_days=365)
    chain_of(tenant, other_tenant)
    purge_later()
    first_kept = AuditArchive.objects.get().last_seq + 1

    for statement in (f"DELETE FROM tools_app_auditevent WHERE seq = {first_kept}",
                      "DELETE FROM tools_app_auditarchive", "UPDATE tools_app_auditarchive SET last_seq = 1"):
        with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
            sql(statement)


def test_a_verification_resumes_at_the_archived_head_when_its_checkpoints_were_archived(db, archive_dir, tenant,
                                                                                        other_tenant):
    AuditRetention.objects.create(tenant=tenant, keep_days=30)
    chain = chain_of(tenant, tenant)
    audit.verify_incrementally(every=2)  # checkpoints up to the newest event, all of them archived below
    later = access.create_tenant("initech")
    AuditRetention.objects.create(tenant=later, keep_days=365)
    audit.seal()

    purge_later()
    audit.seal()
    report = audit.verify_incrementally(every=100)

    assert AuditArchive.objects.get().last_seq == max(chain)
    # initech's creation and the archiving (and the keys destroyed after it): nothing archived again
    assert report.ok and report.verified == 2 + keys_destroyed()
    assert report.head_seq == AuditEvent.objects.get(action="audit.archived").seq


WAITING_ADVISORY = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"


def test_a_verification_page_waits_for_a_running_archiver(transactional_db, archive_dir, tenant):
    chain = chain_of(tenant, tenant)
    reports = []
    with psycopg.connect(database_url()) as archiver:
        archiver.execute("SELECT pg_advisory_xact_lock(%s)", [audit.ARCHIVE_LOCK_KEY])  # an archive under way
        verifier = threading.Thread(target=lambda: reports.append(audit.verify_chain()))
        verifier.start()
        try:
            deadline = time.monotonic() + 30
            while archiver.execute(WAITING_ADVISORY).fetchone()[0] == 0 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert archiver.execute(WAITING_ADVISORY).fetchone()[0] == 1 and reports == []
        finally:
            archiver.rollback()
            verifier.join(timeout=30)

    assert reports[0].ok and reports[0].verified == max(chain)


def test_an_archiver_skips_while_a_verification_page_is_read(transactional_db, archive_dir, tenant):
    AuditRetention.objects.create(tenant=tenant, keep_days=30)
    chain = chain_of(tenant, tenant)
    with psycopg.connect(database_url()) as verifier:
        verifier.execute("SELECT pg_advisory_xact_lock_shared(%s)", [audit.ARCHIVE_LOCK_KEY])  # a page being read

        assert purge_later() == 0
        assert AuditEvent.objects.filter(seq__isnull=False).count() == len(chain)

    assert purge_later() == max(chain)
