"""The audit log's hash chain: sealing, the database guard, and verification finding tampering."""

import threading
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connection, connections, transaction

from tests.support.race import race
from tools_app import access
from tools_app.core import audit
from tools_app.models import AuditEvent, AuditSeal


def some_events(n):
    tenant = access.create_tenant("acme")
    for i in range(n - 1):
        audit.record_event(action="test.event", obj=tenant, actor="system:test", after={"i": i, "x": 1.5})


def sql(statement, params=()):
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.rowcount


class trigger_disabled:
    """What someone with the table owner's rights can do: switch the guard off."""

    def __enter__(self):
        # ALTER TABLE waits for no deferred FK checks of this (test) transaction.
        sql("SET CONSTRAINTS ALL IMMEDIATE")
        sql("ALTER TABLE tools_app_auditevent DISABLE TRIGGER audit_event_append_only")
        sql("ALTER TABLE tools_app_auditseal DISABLE TRIGGER audit_seal_append_only")

    def __exit__(self, *exc):
        sql("ALTER TABLE tools_app_auditevent ENABLE TRIGGER audit_event_append_only")
        sql("ALTER TABLE tools_app_auditseal ENABLE TRIGGER audit_seal_append_only")
        sql("SET CONSTRAINTS ALL DEFERRED")


def seq_of(n):
    return AuditEvent.objects.get(seq=n)


# --- sealing ---------------------------------------------------------------------------


def test_sealing_links_every_event_to_the_previous_one(db):
    some_events(5)

    result = audit.seal()

    events = list(AuditEvent.objects.order_by("seq"))
    assert result.sealed == 5 and [e.seq for e in events] == [1, 2, 3, 4, 5]
    assert events[0].prev_hash == audit.GENESIS_HASH
    assert all(later.prev_hash == earlier.hash for earlier, later in zip(events, events[1:], strict=False))
    assert (result.head_seq, result.head_hash) == (5, events[-1].hash)
    report = audit.verify_chain()
    assert report.ok and (report.verified, report.unsealed) == (5, 0)


def test_a_second_seal_continues_the_chain(db):
    some_events(3)
    audit.seal()
    audit.record_event(action="test.later", obj=AuditEvent.objects.first(), actor="system:test")

    assert audit.seal().sealed == 1
    assert seq_of(4).prev_hash == seq_of(3).hash
    assert list(AuditSeal.objects.order_by("last_seq").values_list("first_seq", "last_seq")) == [(1, 3), (4, 4)]
    assert audit.verify_chain().ok


def test_unsealed_events_are_reported_not_failed(db):
    some_events(2)
    audit.seal()
    some_events_more = AuditEvent.objects.first()
    audit.record_event(action="test.new", obj=some_events_more, actor="system:test")

    report = audit.verify_chain()

    assert report.ok and (report.verified, report.unsealed) == (2, 1)


@pytest.mark.django_db(transaction=True)
def test_an_event_committed_after_a_later_one_is_sealed_in_the_next_seal():
    # given: a transaction holds an event with a lower id, uncommitted
    tenant = access.create_tenant("acme")
    inserted, release = threading.Event(), threading.Event()

    def slow_writer():
        with transaction.atomic():
            audit.record_event(action="test.slow", obj=tenant, actor="system:test")
            inserted.set()
            release.wait(10)
        connections.close_all()

    writer = threading.Thread(target=slow_writer)
    writer.start()
    inserted.wait(10)
    audit.record_event(action="test.fast", obj=tenant, actor="system:test")

    # when: the sealer runs before and after the slow transaction commits
    first = audit.seal()
    release.set()
    writer.join(10)
    second = audit.seal()

    # then: every event is in the chain, in the order it became visible
    assert (first.sealed, second.sealed) == (2, 1)  # tenant.created + test.fast, then test.slow
    slow = AuditEvent.objects.get(action="test.slow")
    assert slow.seq == 3 and slow.pk < AuditEvent.objects.get(action="test.fast").pk
    assert audit.verify_chain().ok


@pytest.mark.django_db(transaction=True)
def test_concurrent_sealers_seal_each_event_once():
    some_events(50)
    sealers = race(*[audit.seal] * 3, timeout=30)

    assert sealers.answered(3) and not sealers.errors
    assert sum(seal.sealed for seal in sealers.results) == 50
    assert sorted(AuditEvent.objects.values_list("seq", flat=True)) == list(range(1, 51))
    assert audit.verify_chain().ok


def test_writers_do_not_wait_for_a_running_sealer(transactional_db):
    # given: a sealer holds the chain's lock in another connection
    some_events(2)
    holding, release = threading.Event(), threading.Event()

    def hold_the_seal_lock():
        with transaction.atomic():
            audit._take_seal_lock(wait=True)
            holding.set()
            release.wait(10)
        connections.close_all()

    sealer = threading.Thread(target=hold_the_seal_lock)
    sealer.start()
    holding.wait(10)
    try:
        # when: a writer records an event, with a lock timeout that would fail it if it waited
        with transaction.atomic():
            sql("SET LOCAL lock_timeout = '1s'")
            audit.record_event(action="test.during_seal", obj=AuditEvent.objects.first(), actor="system:test")
        # and a periodic sealer started meanwhile steps aside instead of queueing
        assert audit.seal(wait=False).sealed == 0
    finally:
        release.set()
        sealer.join(10)

    assert audit.seal().sealed == 3


# --- the database guard -------------------------------------------------------------------


@pytest.mark.parametrize("statement", [
    "UPDATE tools_app_auditevent SET reason = 'edited' WHERE id = %s",
    "DELETE FROM tools_app_auditevent WHERE id = %s",
    "UPDATE tools_app_auditevent SET seq = seq + 100 WHERE id = %s",
    "UPDATE tools_app_auditevent SET hash = 'x' WHERE id = %s",
])
def test_the_database_refuses_to_change_a_sealed_event(db, statement):
    some_events(2)
    audit.seal()
    event = AuditEvent.objects.first()

    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        sql(statement, [event.pk])


def test_the_database_refuses_to_edit_an_unsealed_event_even_while_sealing_it(db):
    some_events(1)
    event = AuditEvent.objects.get()

    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        sql("UPDATE tools_app_auditevent SET seq = 1, hash = 'h', actor = 'someone else' WHERE id = %s", [event.pk])
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        sql("DELETE FROM tools_app_auditevent WHERE id = %s", [event.pk])


def test_the_database_refuses_to_change_or_delete_a_seal(db):
    some_events(1)
    audit.seal()

    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        sql("UPDATE tools_app_auditseal SET last_hash = 'x'")
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        sql("DELETE FROM tools_app_auditseal")


# --- verification finds tampering ------------------------------------------------------------


def test_verification_finds_an_edited_event(db):
    some_events(6)
    audit.seal()

    with trigger_disabled():
        sql("UPDATE tools_app_auditevent SET reason = 'nothing happened' WHERE seq = 4")

    report = audit.verify_chain()
    assert not report.ok
    assert (report.broken.seq, report.broken.event_id) == (4, seq_of(4).pk)
    assert "edited" in report.broken.problem and report.verified == 3


def test_verification_finds_an_edit_inside_the_json_details(db):
    some_events(3)
    audit.seal()

    with trigger_disabled():
        sql("""UPDATE tools_app_auditevent SET after = '{"i": 0, "x": 2.5}' WHERE seq = 2""")

    assert audit.verify_chain().broken.seq == 2


def test_verification_finds_a_deleted_event(db):
    some_events(6)
    audit.seal()

    with trigger_disabled():
        sql("DELETE FROM tools_app_auditevent WHERE seq = 3")

    broken = audit.verify_chain().broken
    assert broken.seq == 3 and "missing" in broken.problem


def test_verification_finds_the_newest_events_deleted(db):
    some_events(6)
    audit.seal()

    with trigger_disabled():
        sql("DELETE FROM tools_app_auditevent WHERE seq >= 5")

    broken = audit.verify_chain().broken
    assert broken.seq == 5 and "a seal covers up to 6" in broken.problem


def test_verification_finds_a_chain_rewritten_after_an_edit(db):
    # given: someone edits event 2 and recomputes every later hash so the links match again
    some_events(4)
    audit.seal()
    with trigger_disabled():
        sql("UPDATE tools_app_auditevent SET actor = 'user:nobody' WHERE seq = 2")
        prev = seq_of(1).hash
        for n in range(2, 5):
            event = seq_of(n)
            new_hash = audit.event_hash(prev, event)
            sql("UPDATE tools_app_auditevent SET prev_hash = %s, hash = %s WHERE seq = %s", [prev, new_hash, n])
            prev = new_hash

    # then: the seal written at the time no longer matches
    broken = audit.verify_chain().broken
    assert broken.seq == 4 and "seal" in broken.problem


def test_the_command_reports_a_sound_chain(db):
    some_events(3)
    out = StringIO()

    call_command("verify_audit_log", "--seal", stdout=out)

    assert "sealed 3 new events" in out.getvalue() and "OK: 3 events verified" in out.getvalue()


def test_the_command_fails_on_a_tampered_row(db):
    some_events(3)
    audit.seal()
    with trigger_disabled():
        sql("UPDATE tools_app_auditevent SET action = 'tenant.renamed' WHERE seq = 1")

    with pytest.raises(CommandError, match=r"BROKEN at seq 1 \(event id \d+\): its content was edited"):
        call_command("verify_audit_log", stdout=StringIO())
