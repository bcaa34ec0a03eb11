"""Incremental verification of the audit chain: checkpoints per verified range, resuming after a crash."""

import os
import re
import signal
import subprocess
import sys
import time
from io import StringIO

import psycopg
import pytest
from django.core.management import CommandError, call_command

from tests.core.test_audit_chain import some_events, sql, trigger_disabled
from tests.support.processes import ROOT, child_env
from tests.support.processes import test_database_url as database_url
from tools_app import access
from tools_app.core import audit
from tools_app.models import AuditCheckpoint, Tenant


def more_events(n):
    tenant = Tenant.objects.get(slug="acme")
    for i in range(n):
        audit.record_event(action="test.later", obj=tenant, actor="system:test", after={"i": i})


def checkpoints():
    return list(AuditCheckpoint.objects.order_by("last_seq").values_list("first_seq", "last_seq"))


def test_verification_stores_a_checkpoint_after_each_sound_range(db):
    some_events(25)
    audit.seal()

    report = audit.verify_incrementally(every=10)

    assert report.ok and report.verified == 25 and report.head_seq == 25
    assert checkpoints() == [(1, 10), (11, 20), (21, 25)]
    newest = AuditCheckpoint.objects.get(last_seq=25)
    assert newest.last_hash == audit.AuditEvent.objects.get(seq=25).hash and newest.events == 5


def test_a_second_verification_checks_only_the_events_after_the_newest_checkpoint(db):
    some_events(12)
    audit.seal()
    audit.verify_incrementally(every=10)
    more_events(4)
    audit.seal()

    report = audit.verify_incrementally(every=10)

    assert report.ok and report.verified == 4 and report.head_seq == 16
    assert checkpoints() == [(1, 10), (11, 12), (13, 16)]


def test_an_event_edited_after_the_newest_checkpoint_is_found_by_the_resumed_verification(db):
    some_events(10)
    audit.seal()
    audit.verify_incrementally(every=5)
    more_events(5)
    audit.seal()
    with trigger_disabled():
        sql("UPDATE tools_app_auditevent SET reason = 'nothing to see' WHERE seq = 13")

    report = audit.verify_incrementally(every=5)

    assert report.broken.seq == 13 and "edited" in report.broken.problem
    assert report.verified == 2  # 11 and 12, after the checkpoint at 10
    assert checkpoints() == [(1, 5), (6, 10)]  # the broken range is not checkpointed


def test_an_event_edited_before_a_checkpoint_is_found_by_a_full_verification(db):
    some_events(10)
    audit.seal()
    audit.verify_incrementally(every=5)
    with trigger_disabled():
        sql("UPDATE tools_app_auditevent SET actor = 'someone else' WHERE seq = 3")

    report = audit.verify_incrementally(every=5, full=True)

    assert report.broken.seq == 3 and "edited" in report.broken.problem


def test_the_link_after_a_checkpoint_must_match_the_checkpointed_hash(db):
    some_events(10)
    audit.seal()
    audit.verify_incrementally(every=5)
    more_events(3)
    audit.seal()
    with trigger_disabled():  # the event at the checkpoint rewritten, and the next link with it
        sql("UPDATE tools_app_auditevent SET prev_hash = %s WHERE seq = 11", ["f" * 64])

    report = audit.verify_incrementally(every=5)

    assert report.broken.seq == 11 and "link" in report.broken.problem


def test_a_range_not_starting_at_a_checkpoint_is_checked_but_not_checkpointed(db):
    some_events(20)
    audit.seal()

    report = audit.verify_incrementally(every=5, from_seq=8, to_seq=17)

    assert report.ok and report.verified == 10 and report.head_seq == 17
    assert checkpoints() == []


def test_a_range_starting_just_after_a_checkpoint_is_checkpointed(db):
    some_events(20)
    audit.seal()
    audit.verify_incrementally(every=5, to_seq=7)

    report = audit.verify_incrementally(every=5, from_seq=8, to_seq=12)

    assert report.ok and report.verified == 5
    assert checkpoints() == [(1, 5), (6, 7), (8, 12)]


def test_the_command_shows_progress_and_resumes_after_its_checkpoint(db):
    some_events(7)
    out, progress = StringIO(), StringIO()

    call_command("verify_audit_log", "--seal", "--checkpoint-every", "3", stdout=out, stderr=progress)

    assert out.getvalue().splitlines() == ["sealed 7 new events", out.getvalue().splitlines()[-1]]
    lines = progress.getvalue().splitlines()
    assert [line for line in lines if line.startswith("verified up to")] == [
        "verified up to seq 3 of 7 (checkpoint stored)", "verified up to seq 6 of 7 (checkpoint stored)",
        "verified up to seq 7 of 7 (checkpoint stored)"]
    again = StringIO()
    call_command("verify_audit_log", stdout=again)
    assert "OK: 0 events verified; head seq 7" in again.getvalue()
    full = StringIO()
    call_command("verify_audit_log", "--full", "--checkpoint-every", "100", stdout=full)
    assert "OK: 7 events verified" in full.getvalue()


def test_the_command_reports_a_tampered_row_inside_a_range(db):
    some_events(9)
    audit.seal()
    with trigger_disabled():
        sql("UPDATE tools_app_auditevent SET object_id = '999' WHERE seq = 6")

    call_command("verify_audit_log", "--from-seq", "2", "--to-seq", "5", stdout=StringIO())
    with pytest.raises(CommandError, match=r"BROKEN at seq 6 \(event id \d+\): its content was edited"):
        call_command("verify_audit_log", "--from-seq", "2", "--to-seq", "8", stdout=StringIO())


def many_events(n):
    tenant = access.create_tenant("bulk")
    audit.AuditEvent.objects.bulk_create(
        audit.new_event(action="test.event", obj=tenant, actor="system:test", after={"i": i}) for i in range(n))


WAITING_FOR_CHECKPOINTS = ("SELECT pid FROM pg_locks WHERE NOT granted "
                           "AND relation = 'tools_app_auditcheckpoint'::regclass")


def read_progress(child, lines):
    """Read the verifier's output until it has printed `lines` progress lines."""
    seen = []
    while len(seen) < lines:
        line = child.stdout.readline()
        assert line, f"the verifier stopped before {lines} ranges: {seen}"
        if line.startswith("verified up to"):
            seen.append(line)


def test_a_verification_killed_halfway_resumes_from_its_last_checkpoint(transactional_db):
    """The verifier is a real process, SIGKILLed while it is between two checkpoints."""
    many_events(9999)  # and the tenant's creation event: 10,000 events, 100 ranges
    audit.seal()
    child = subprocess.Popen([sys.executable, "manage.py", "verify_audit_log", "--checkpoint-every", "100"],
                             cwd=ROOT, env=child_env(PYTHONUNBUFFERED="1"), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        with psycopg.connect(database_url()) as blocker, \
                psycopg.connect(database_url(), autocommit=True) as watcher:
            read_progress(child, 3)
            # Hold its next checkpoint back: the verifier checks the next range, then waits to store it.
            blocker.execute("LOCK TABLE tools_app_auditcheckpoint IN SHARE MODE")
            for _ in range(600):
                waiting = watcher.execute(WAITING_FOR_CHECKPOINTS).fetchall()
                if waiting or child.poll() is not None:
                    break
                time.sleep(0.05)
            assert waiting, "the verifier finished (or never reached a checkpoint) before it could be killed"
            os.killpg(child.pid, signal.SIGKILL)
            child.wait(timeout=10)
            # The server notices a dead client only when it next talks to it: end its session, as a
            # server does when the connection drops, before the lock is released.
            watcher.execute("SELECT pg_terminate_backend(%s)", [waiting[0][0]])
            blocker.rollback()
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait(timeout=10)
        child.stdout.close()
    assert child.returncode == -signal.SIGKILL
    before = checkpoints()
    killed_at = before[-1][1]
    assert 3 <= len(before) < 100 and before == [(n * 100 + 1, n * 100 + 100) for n in range(len(before))]

    out, err = StringIO(), StringIO()
    call_command("verify_audit_log", "--checkpoint-every", "100", stdout=out, stderr=err)

    verified = int(re.search(r"OK: (\d+) events verified; head seq 10000", out.getvalue()).group(1))
    assert verified == 10_000 - killed_at  # nothing checkpointed was checked again
    progress = err.getvalue().splitlines()
    assert progress[0] == f"verified up to seq {killed_at + 100} of 10000 (checkpoint stored)"
    after = checkpoints()
    assert after[:len(before)] == before and len(after) == 100 and after[len(before)][0] == killed_at + 1
