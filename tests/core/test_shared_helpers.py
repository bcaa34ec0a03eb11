"""One implementation of each shared mechanism, and every user goes through it: backoff, leases,
polling, tenant scoping, hashed secrets, and the guarded transition with its audit row."""

from __future__ import annotations

import asyncio
import os
import random
import re
import socket
from contextlib import contextmanager
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.db import DataError, OperationalError, transaction
from django.utils import timezone

from tests.support.operators import agent_owner, make_operator, verified
from tests.support.processes import free_port
from tools_app import access, engine, outbox, tasks
from tools_app.access import auditors, secrets
from tools_app.access.roles import AUDITOR, OPERATOR
from tools_app.conf import override_conf
from tools_app.core import backoff, clock, db, leases, polling
from tools_app.engine import Operation
from tools_app.engine.transitions import WRITE_RETRY_BASE_SECONDS, WRITE_RETRY_MAX_SECONDS
from tools_app.models import (
    ApiToken,
    AuditEvent,
    AuditorKey,
    IdempotencyRecord,
    OutboxEvent,
    OutboxStatus,
    StepRun,
    Task,
    Tenant,
)
from tools_app.reconciliation.reconcile import BACKOFF_MAX_SECONDS as RECONCILE_BACKOFF_MAX
from tools_app.reconciliation.reconcile import next_attempt_in
from tools_app.tasks import jobs as task_jobs
from tools_app.toolkit import downstream
from tools_app.toolkit.calls import call_tool
from tools_app.toolkit.pipelines import RetryPolicy
from tools_app.toolkit.registry import get_tool

OWNER = re.compile(rf"^{re.escape(socket.gethostname())}:{os.getpid()}:[0-9a-f]{{8}}$")


def seeded(seed: int) -> random.Random:
    """The draws the shared `random` makes after random.seed(seed)."""
    return random.Random(seed)


def close_to(delta: timedelta, seconds: float) -> bool:
    """Equal up to the microsecond a timestamp keeps."""
    return abs(delta.total_seconds() - seconds) < 2e-6


# --- backoff ----------------------------------------------------------------------------------------


def test_backoff_is_half_the_doubling_cap_plus_a_uniform_draw_of_the_other_half():
    for attempt, cap in ((1, 2.0), (2, 4.0), (3, 8.0), (6, 50.0), (40, 50.0)):
        expected = cap / 2 + random.Random(attempt).uniform(0, cap / 2)
        assert backoff.delay(attempt, base=2, ceiling=50, rng=random.Random(attempt)) == expected


def test_backoff_waits_at_least_half_and_at_most_all_of_its_cap_spread_between_them():
    rng = random.Random(11)

    for attempt in range(1, 12):
        cap = min(100.0, 0.5 * 2 ** (attempt - 1))
        samples = [backoff.delay(attempt, base=0.5, ceiling=100, rng=rng) for _ in range(300)]
        assert cap / 2 <= min(samples) and max(samples) <= cap
        assert max(samples) - min(samples) > cap / 2 * 0.9  # spread over the whole upper half


def test_backoff_of_a_huge_attempt_is_the_ceiling_without_overflowing():
    assert 5 <= backoff.delay(100_000, base=1, ceiling=10, rng=random.Random(1)) <= 10


@pytest.mark.parametrize(("attempt", "base", "ceiling"), [(0, 1, 10), (-1, 1, 10), (1, -1, 10), (1, 1, -5)])
def test_backoff_refuses_an_attempt_below_one_and_negative_seconds(attempt, base, ceiling):
    with pytest.raises(ValueError):
        backoff.delay(attempt, base=base, ceiling=ceiling)


def test_a_failed_write_is_told_the_backoff_of_its_attempt_and_may_not_run_before_it(tenant):
    op = Operation(tenant_id=tenant.pk, tool="create_order", key="k-1", arguments={"n": 1}, actor="agent:acme/t")

    def flaky(record):
        raise OperationalError("the database went away; the transaction rolls back")

    random.seed(21)
    first = engine.run(op, flaky)
    record = IdempotencyRecord.objects.get()
    IdempotencyRecord.objects.update(retry_not_before=timezone.now())  # its wait is over
    random.seed(22)
    second = engine.run(op, flaky)

    expected = [backoff.delay(n, base=WRITE_RETRY_BASE_SECONDS, ceiling=WRITE_RETRY_MAX_SECONDS, rng=seeded(seed))
                for n, seed in ((1, 21), (2, 22))]
    assert [first.error.retry_after, second.error.retry_after] == expected
    assert first.error.error_class == second.error.error_class == "transient"
    # the record keeps the same wait: a retry before then is answered, not run
    record.refresh_from_db()
    assert record.attempts == 2 and close_to(record.retry_not_before - record.finished_at, expected[1])


def test_an_unreachable_downstream_is_a_transient_failure_with_the_backoff_of_its_attempt(tenant):
    url = f"http://127.0.0.1:{free_port()}/payments"  # nothing listens: the request never leaves
    op = Operation(tenant_id=tenant.pk, tool="request_payment", key="p-1", arguments={"n": 1}, transactional=False)

    random.seed(5)
    outcome = engine.run(op, lambda record: downstream.request("POST", url, timeout=1).json())

    assert outcome.error.error_class == "transient"
    assert outcome.error.retry_after == backoff.delay(1, base=WRITE_RETRY_BASE_SECONDS,
                                                      ceiling=WRITE_RETRY_MAX_SECONDS, rng=seeded(5))


def test_reconciliation_asks_again_after_the_backoff_of_its_attempt(settings):
    override_conf(settings, reconcile_backoff_seconds=10, reconcile_max_attempts=6)

    random.seed(3)
    assert next_attempt_in(4) == backoff.delay(4, base=10, ceiling=RECONCILE_BACKOFF_MAX, rng=seeded(3))
    assert next_attempt_in(6) is None  # attempts used up: a person decides


def test_the_outbox_retries_a_failed_delivery_after_the_backoff_of_its_attempt(tenant, settings):
    override_conf(settings, outbox_backoff_seconds=7, outbox_max_attempts=8)
    event = new_outbox_event(tenant, attempts=2)

    random.seed(8)
    before = timezone.now()
    dead = outbox.record_failed_attempt(event, "connection refused")
    after = timezone.now()

    event.refresh_from_db()
    delay = backoff.delay(3, base=7, ceiling=outbox.relay.BACKOFF_MAX_SECONDS, rng=seeded(8))
    assert not dead and event.attempts == 3 and event.status == OutboxStatus.PENDING
    assert before + timedelta(seconds=delay) <= event.next_attempt_at <= after + timedelta(seconds=delay)


def test_a_task_waits_the_shared_backoff_between_its_runs(settings):
    override_conf(settings, task_backoff_base_seconds=3, task_backoff_max_seconds=40)

    assert RetryPolicy().backoff(4, random.Random(9)) == backoff.delay(4, base=3, ceiling=40, rng=random.Random(9))
    assert RetryPolicy(base_seconds=1, max_seconds=5).backoff(2, random.Random(9)) == backoff.delay(
        2, base=1, ceiling=5, rng=random.Random(9))


# --- leases ------------------------------------------------------------------------------------------


def test_a_lease_runs_out_its_length_after_it_was_taken_by_the_databases_clock(tenant):
    expiry, now = Tenant.objects.annotate(expiry=leases.expiry(12.5), now=clock.NOW).values_list(
        "expiry", "now").get(pk=tenant.pk)

    assert expiry == now + timedelta(seconds=12.5)
    assert OWNER.match(leases.new_owner()) and leases.new_owner() != leases.new_owner()


def test_an_executor_holds_its_record_under_a_lease_owner_name_for_the_write_lease(tenant, settings):
    override_conf(settings, execution_lease_seconds=7)

    record, claimed = engine.claim(Operation(tenant_id=tenant.pk, tool="create_order", key="k", arguments={}))

    assert claimed and OWNER.match(record.lease_owner)
    assert record.lease_expires_at - record.created_at == timedelta(seconds=7)


@pytest.mark.django_db(transaction=True)
def test_a_task_worker_holds_its_task_under_a_lease_owner_name_for_the_task_lease(caller, settings):
    override_conf(settings, task_call_wait_seconds=0, task_lease_seconds=45)
    started = call_tool(get_tool("start_task"), caller, {
        "tool": "ingest_document", "arguments": {"text": "# A\n\nOne line."}, "idempotency_key": "t-1"})
    task = Task.objects.get(pk=started.result["task_id"])

    before = timezone.now()
    taken = tasks.take(task.pk, leases.new_owner())
    after = timezone.now()
    assert before + timedelta(seconds=45) <= taken.lease_expires_at <= after + timedelta(seconds=45)

    # and the job that runs it names its worker the same way
    Task.objects.filter(pk=task.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    tasks.expire_lease(Task.objects.get(pk=task.pk))
    task_jobs.run_task(str(task.pk))
    workers = set(StepRun.objects.filter(task=task).values_list("worker", flat=True))
    assert Task.objects.get(pk=task.pk).status == "succeeded"
    assert len(workers) == 1 and OWNER.match(workers.pop())


# --- polling -----------------------------------------------------------------------------------------


def test_polling_stops_as_soon_as_the_predicate_holds_reading_again_after_each_pause():
    seen, refreshed = [], []

    def stop():
        seen.append(len(refreshed))
        return len(refreshed) == 3

    assert polling.until(stop, seconds=30, pause=0.001, max_pause=0.004, refresh=lambda: refreshed.append(1))
    assert seen == [0, 1, 2, 3]


def test_polling_that_is_already_done_neither_pauses_nor_reads_again():
    refreshed = []

    assert polling.until(lambda: True, seconds=0, pause=10, refresh=lambda: refreshed.append(1))
    assert refreshed == []


def test_polling_gives_up_at_its_deadline_with_a_last_look():
    asked = []

    assert not polling.until(lambda: asked.append(1) and False, seconds=0.05, pause=0.01, max_pause=0.02)
    assert len(asked) >= 2  # asked at once, and again after the pause that reached the deadline


def test_a_wait_is_a_value_awaited_outside_any_thread_and_the_call_goes_on_from_it_not_from_the_top():
    # given a call that does some work, waits for a flag another party sets, then goes on
    flag, threads_held, began, went_on = [], [], [], []

    def the_call():
        began.append(1)
        return polling.waiting(lambda: bool(flag), lambda: went_on.append(1) or ("done", len(began)),
                               seconds=30, pause=0.001)

    async def in_thread(fn, *args):
        threads_held.append(fn)
        return fn(*args)

    async def scenario():
        async def set_flag_later():
            await asyncio.sleep(0.05)
            flag.append(1)

        setter = asyncio.ensure_future(set_flag_later())
        result = await polling.settle_async(in_thread, the_call)
        await setter
        return result

    # when it is settled on an event loop
    result = asyncio.run(scenario())

    # then it began once and went on once after the wait, each part and each check a short borrow
    # of a thread
    assert result == ("done", 1) and began == [1] and went_on == [1]
    assert len(threads_held) >= 3


def test_a_wait_that_already_holds_goes_on_at_once_and_one_settled_in_a_thread_is_plain_polling():
    assert polling.waiting(lambda: True, lambda: "at once", seconds=0, pause=10) == "at once"

    pending = polling.waiting(lambda: False, lambda: "gave up", seconds=0.02, pause=0.005)
    assert isinstance(pending, polling.Pending)
    assert polling.settle(pending) == "gave up"


def test_waits_chain_a_value_mapped_over_two_waits_and_a_scope_entered_for_each_part():
    # given a call that waits twice, each part inside a scope
    entered, checks = [], iter([False, True, False, True])

    @contextmanager
    def scope():
        entered.append(1)
        yield

    def second(first):
        return polling.waiting(lambda: next(checks), lambda: first + ["second"], seconds=30, pause=0.001)

    pending = polling.waiting(lambda: next(checks), lambda: ["first"], seconds=30, pause=0.001)

    # when it is mapped over and settled
    result = polling.settle(pending.within(scope).map(second).map(lambda value: value + ["mapped"]))

    # then both waits ran in order and the scope was entered for the part after the first wait
    assert result == ["first", "second", "mapped"]
    assert entered == [1]


# --- tenant scoping ----------------------------------------------------------------------------------


def test_scope_shows_a_superuser_every_tenant_a_person_their_grants_and_an_auditor_key_its_own(
        tenant, other_tenant):
    for each in (tenant, other_tenant):
        access.issue_token(each, "bot", owner=agent_owner())
    operator = make_operator("olga", OPERATOR, tenant)
    _, raw = auditors.issue_key("ext-audit", [other_tenant], actor="user:root")
    key_auditor = auditors.authenticate_key(raw)
    root = User.objects.create_superuser("root")

    def tenants_seen(who) -> set[str]:
        return set(access.scope(ApiToken.objects.all(), who).values_list("tenant__slug", flat=True))

    assert tenants_seen(root) == {"acme", "globex"}
    assert tenants_seen(operator) == {"acme"}
    assert tenants_seen(key_auditor) == {"globex"}
    assert tenants_seen(make_operator("nobody", AUDITOR)) == set()
    # through another field: the tenants themselves
    assert list(access.scope(Tenant.objects.all(), operator, "id")) == [tenant]


# --- hashed secrets ----------------------------------------------------------------------------------


def test_tokens_and_auditor_keys_are_stored_only_as_their_digest_and_prefix(tenant):
    token, raw_token = access.issue_token(tenant, "bot", owner=agent_owner())
    key, raw_key = auditors.issue_key("ext-audit", [tenant], actor="user:root")

    for row, raw, kind in ((token, raw_token, "idm_"), (key, raw_key, "ida_")):
        assert raw.startswith(kind) and len(raw) > 40
        assert (row.digest, row.prefix) == (secrets.digest(raw), raw[:12])
        assert raw not in {row.digest, row.prefix}


def test_a_secret_of_one_kind_does_not_open_the_other(tenant):
    _, raw_token = access.issue_token(tenant, "bot", owner=agent_owner())
    _, raw_key = auditors.issue_key("ext-audit", [tenant], actor="user:root")

    assert auditors.authenticate_key(raw_token) is None and access.authenticate_token(raw_key) is None
    assert access.authenticate_token(raw_token).name == "bot"
    assert auditors.authenticate_key(raw_key).key.name == "ext-audit"


@pytest.mark.parametrize("kind", ["token", "auditor key"])
def test_last_use_is_noted_at_most_once_per_resolution(tenant, kind, settings):
    # Each check reads the row (a web process's token cache would answer repeated checks itself).
    override_conf(settings, token_cache_seconds=0)
    if kind == "token":
        row, raw = access.issue_token(tenant, "bot", owner=agent_owner())
        check = access.authenticate_token
    else:
        row, raw = auditors.issue_key("ext-audit", [tenant], actor="user:root")
        check = auditors.authenticate_key
    rows = type(row).objects.filter(pk=row.pk)

    check(raw)
    first = rows.get().last_used_at
    recently = timezone.now() - secrets.LAST_USED_RESOLUTION / 2
    rows.update(last_used_at=recently)
    check(raw)
    kept = rows.get().last_used_at
    rows.update(last_used_at=timezone.now() - secrets.LAST_USED_RESOLUTION * 2)
    check(raw)

    assert first is not None and kept == recently and rows.get().last_used_at > recently


def test_revoking_a_token_or_a_key_is_one_audited_transition_that_happens_once(tenant):
    token, raw_token = access.issue_token(tenant, "bot", owner=agent_owner())
    key, raw_key = auditors.issue_key("ext-audit", [tenant], actor="user:root")

    assert access.revoke_token(token, actor="user:root", reason="leaked")
    assert auditors.revoke_key(key, actor="user:root", reason="engagement over")
    assert not access.revoke_token(ApiToken.objects.get(), actor="user:root")
    assert not auditors.revoke_key(AuditorKey.objects.get(), actor="user:root")

    assert access.authenticate_token(raw_token) is None and auditors.authenticate_key(raw_key) is None
    events = AuditEvent.objects.filter(action__in=["token.revoked", "auditor_key.revoked"])
    assert sorted(events.values_list("action", "reason", "tenant_id")) == [
        ("auditor_key.revoked", "engagement over", None), ("token.revoked", "leaked", tenant.pk)]


# --- guarded transitions -----------------------------------------------------------------------------


def new_outbox_event(tenant, **fields) -> OutboxEvent:
    now = timezone.now()
    return OutboxEvent.objects.create(tenant=tenant, kind="notification.email", payload={"to": "a@example.com"},
                                      next_attempt_at=now, created_at=now, **fields)


def test_a_transition_moves_the_row_applies_the_change_and_writes_its_event(tenant):
    event = new_outbox_event(tenant)

    moved = db.transition(event, {"status": OutboxStatus.PENDING, "delivered_at": None},
                          {"status": OutboxStatus.DEAD, "last_error": "gone"}, action="outbox.test", actor="system:t",
                          reason="why", before={"status": "pending"}, after={"status": "dead"})

    assert moved and (event.status, event.last_error) == (OutboxStatus.DEAD, "gone")
    assert OutboxEvent.objects.get().status == OutboxStatus.DEAD
    written = AuditEvent.objects.get(action="outbox.test")
    assert (written.object_id, written.tenant_id, written.actor, written.reason, written.before, written.after) == (
        str(event.pk), tenant.pk, "system:t", "why", {"status": "pending"}, {"status": "dead"})


def test_a_transition_whose_row_moved_first_writes_nothing(tenant):
    event = new_outbox_event(tenant)
    OutboxEvent.objects.update(status=OutboxStatus.DELIVERED)

    moved = db.transition(event, {"status": OutboxStatus.PENDING}, {"status": OutboxStatus.DEAD},
                          action="outbox.test", actor="system:t")

    assert not moved and event.status == OutboxStatus.PENDING
    assert OutboxEvent.objects.get().status == OutboxStatus.DELIVERED
    assert not AuditEvent.objects.filter(action="outbox.test").exists()


def test_transitions_of_one_shape_share_their_sql_but_not_the_clock_expressions_values(tenant):
    # One statement text per shape (psycopg prepares it): the delays are parameters, not part of the text.
    soon, later = new_outbox_event(tenant), new_outbox_event(tenant)

    for event, seconds in ((soon, 10), (later, 3600)):
        assert db.transition(event, {"status": OutboxStatus.PENDING, "next_attempt_at__lte": clock.later(60)},
                             {"attempts": 1, "next_attempt_at": clock.later(seconds)}, action="outbox.test",
                             actor="system:t")

    rows = dict(OutboxEvent.objects.annotate(now=clock.NOW).values_list("pk", "next_attempt_at"))
    # The instance holds the value the database computed, not the expression.
    assert (soon.next_attempt_at, later.next_attempt_at) == (rows[soon.pk], rows[later.pk])
    assert timedelta(seconds=3589) < later.next_attempt_at - soon.next_attempt_at < timedelta(seconds=3591)
    # An expected value that is an expression is compared in SQL: nothing is due an hour before now.
    assert not db.transition(later, {"next_attempt_at__lte": clock.later(-3600)}, {"attempts": 2},
                             action="outbox.test", actor="system:t")


def test_a_claim_holds_the_times_the_database_wrote_for_its_record(tenant):
    record, claimed = engine.claim(Operation(tenant_id=tenant.pk, tool="t", key="k-times", arguments={"a": 1},
                                             actor="agent:acme/a", retention=timedelta(days=3)))

    stored = IdempotencyRecord.objects.annotate(now=clock.NOW).get(pk=record.pk)
    assert claimed
    assert (record.created_at, record.expires_at, record.lease_expires_at) == (
        stored.created_at, stored.expires_at, stored.lease_expires_at)
    assert record.expires_at - record.created_at == timedelta(days=3)
    assert record.read_at == stored.created_at  # the statement's own time


@pytest.mark.django_db(transaction=True)
def test_a_transition_whose_event_cannot_be_written_changes_nothing_even_outside_a_transaction(tenant):
    event = new_outbox_event(tenant)

    with pytest.raises(DataError):  # the actor column holds 200 characters
        db.transition(event, {"status": OutboxStatus.PENDING}, {"status": OutboxStatus.DEAD},
                      action="outbox.test", actor="x" * 300)

    assert transaction.get_autocommit()
    assert OutboxEvent.objects.get().status == OutboxStatus.PENDING
    assert not AuditEvent.objects.filter(action="outbox.test").exists()


def test_every_outbox_move_writes_its_event(tenant, settings):
    override_conf(settings, outbox_max_attempts=2)
    delivered, failing = new_outbox_event(tenant), new_outbox_event(tenant)

    outbox.mark_delivered(delivered)
    outbox.record_failed_attempt(failing, "timed out")
    outbox.record_failed_attempt(failing, "timed out again")
    outbox.redrive(failing, verified(User.objects.create_superuser("root")), reason="sink fixed")

    def actions(event):
        return list(AuditEvent.objects.filter(object_id=str(event.pk)).order_by("id").values_list("action", "after"))

    assert actions(delivered) == [("outbox.delivered", {"status": "delivered", "attempts": 1})]
    assert [action for action, _ in actions(failing)] == [
        "outbox.retry_scheduled", "outbox.dead_lettered", "outbox.redriven"]
    assert OutboxEvent.objects.get(pk=failing.pk).status == OutboxStatus.PENDING
