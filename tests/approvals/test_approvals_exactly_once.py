"""Approvals execute exactly once: concurrent approvers, repeated jobs racing retries, transient failures."""


import pytest
from django.db import connection
from django.utils import timezone
from django_q.models import OrmQ

from idemops_demo.models import Announcement
from tests.support.approvals_support import STAFF_NOTE, call, pending_request
from tests.support.jobs import run_queued_jobs
from tests.support.operators import make_operator
from tests.support.race import race
from tools_app import approvals
from tools_app.access.roles import APPROVER
from tools_app.core.errors import Refused
from tools_app.models import ApprovalRequest, ApprovalStatus, AuditEvent, IdempotencyRecord, RecordStatus
from tools_app.toolkit.calls import Caller

# --- exactly once --------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_two_people_approving_at_once_queue_one_execution(tenant):
    caller = Caller(tenant_id=tenant.pk, actor="agent:acme/test")
    bob, carol = make_operator("bob", APPROVER, tenant), make_operator("carol", APPROVER, tenant)
    request = pending_request(call(caller, "publish_announcement", idempotency_key="a-1", **STAFF_NOTE))

    approving = race(lambda: approvals.approve(request, bob), lambda: approvals.approve(request, carol))
    errors = approving.errors

    assert approving.answered(2) and len(approving.results) == 1
    assert len(errors) == 1 and isinstance(errors[0], Refused) and "no longer pending" in str(errors[0])
    assert OrmQ.objects.count() == 1
    run_queued_jobs()
    assert Announcement.objects.count() == 1
    assert ApprovalRequest.objects.get().status == ApprovalStatus.EXECUTED


@pytest.mark.django_db(transaction=True)
def test_repeated_jobs_racing_the_agents_retries_execute_once(tenant):
    # given: an approved request
    caller = Caller(tenant_id=tenant.pk, actor="agent:acme/test")
    request = pending_request(call(caller, "publish_announcement", idempotency_key="a-1", **STAFF_NOTE))
    approvals.approve(request, make_operator("bob", APPROVER, tenant))
    OrmQ.objects.all().delete()  # the jobs below stand for its delivery and two redeliveries
    answers = []

    def retry():
        answers.append(call(caller, "publish_announcement", idempotency_key="a-1", **STAFF_NOTE))

    # when: three deliveries of the job and five agent retries start together
    racing = race(*[lambda: approvals.run_approved(request.pk)] * 3, *[retry] * 5)
    errors = racing.errors

    assert racing.answered(8) and len(answers) == 5

    # then
    assert errors == []
    announcement = Announcement.objects.get()
    assert AuditEvent.objects.filter(action="record.succeeded", operation_id=request.operation_id).count() == 1
    assert AuditEvent.objects.filter(action="record.approved_execution").count() == 1
    for answer in answers:
        if answer.error is None:
            assert answer.result["announcement_id"] == announcement.pk and answer.replayed
        else:
            assert answer.error.error_class in {"pending_approval", "in_progress"}
    assert ApprovalRequest.objects.get().status == ApprovalStatus.EXECUTED


@pytest.mark.django_db(transaction=True)
def test_a_transient_failure_after_approval_runs_again_with_the_key_without_a_new_approval(tenant):
    caller = Caller(tenant_id=tenant.pk, actor="agent:acme/test")
    request = pending_request(call(caller, "publish_announcement", idempotency_key="a-1", **STAFF_NOTE))
    approvals.approve(request, make_operator("bob", APPROVER, tenant))
    with refusing_inserts("idemops_demo_announcement"):  # the database fails the approved run
        run_queued_jobs()
    record = IdempotencyRecord.objects.get(tool="publish_announcement")
    assert (record.status, record.error_class) == (RecordStatus.FAILED, "transient")
    assert ApprovalRequest.objects.get().status == ApprovalStatus.APPROVED  # not final yet

    IdempotencyRecord.objects.filter(pk=record.pk).update(retry_not_before=timezone.now())
    retry = call(caller, "publish_announcement", idempotency_key="a-1", **STAFF_NOTE)
    approvals.sweep()

    assert retry.error is None and Announcement.objects.count() == 1
    assert ApprovalRequest.objects.count() == 1
    assert ApprovalRequest.objects.get().status == ApprovalStatus.EXECUTED


class refusing_inserts:
    """A real fault: a trigger that makes PostgreSQL refuse INSERTs into a table, as a serialization
    failure under contention does (an infrastructure failure: `transient`, where a bug is not)."""

    def __init__(self, table):
        self.table = table

    def __enter__(self):
        with connection.cursor() as cursor:
            cursor.execute("CREATE FUNCTION test_refuse() RETURNS trigger LANGUAGE plpgsql AS "
                           "$$ BEGIN RAISE EXCEPTION 'injected fault' USING ERRCODE = 'serialization_failure'; END $$")
            cursor.execute(f"CREATE TRIGGER test_refuse BEFORE INSERT ON {self.table} "
                           "FOR EACH ROW EXECUTE FUNCTION test_refuse()")

    def __exit__(self, *exc):
        with connection.cursor() as cursor:
            cursor.execute(f"DROP TRIGGER test_refuse ON {self.table}")
            cursor.execute("DROP FUNCTION test_refuse()")
