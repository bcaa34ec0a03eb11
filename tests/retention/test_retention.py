"""Retention tiers and the purge: per tool, per tenant, batched with SKIP LOCKED, audited, and the audit
chain still verifies afterwards."""

import threading
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection, transaction
from django.urls import reverse
from django.utils import timezone

from idemops_demo.models import Document, DocumentChunk, Order
from tests.support.issued_ids import issued_key
from tests.support.operators import make_operator
from tests.support.round_trips import round_trips
from tools_app import access, retention
from tools_app.access.roles import AUDITOR, OPERATOR
from tools_app.conf import override_conf
from tools_app.core import audit, keys
from tools_app.core.errors import PermissionDenied
from tools_app.models import AuditEvent, Checkpoint, IdempotencyRecord, RetentionOverride, Task, TaskArtifact
from tools_app.tasks import jobs as task_jobs
from tools_app.toolkit.calls import Caller, call_tool
from tools_app.toolkit.registry import get_tool

ORDER = {"customer": "ACME", "items": [{"sku": "BOLT-1", "quantity": 3, "unit_price": "2.50"}], "currency": "EUR"}
PAYMENT = {"amount": "42.50", "currency": "EUR", "payee": "ACME Supplies"}


def call(caller, tool, arguments):
    return call_tool(get_tool(tool), caller, arguments)


def age(model, days: float, **filters) -> None:
    """Time passes: the rows finished (and their keys expired) `days` ago."""
    then = timezone.now() - timedelta(days=days)
    fields = {"finished_at": then, "expires_at": then} if model is IdempotencyRecord else {"finished_at": then}
    model.objects.filter(**filters).update(**fields)


def order(caller, key):
    result = call(caller, "create_order", {**ORDER, "idempotency_key": key})
    assert result.error is None, result.error
    return result


def test_a_purged_key_follows_its_expiry_policy_and_the_audit_chain_still_verifies(transactional_db, caller,
                                                                                    downstreams, gateway):
    # given an order and a payment whose keys expired long ago (past even the payment's year of retention)
    first_order = order(caller, "o-1").result
    payment_key = issued_key(caller, "request_payment", "p-1", PAYMENT)  # its prepare_operation call is a record too
    paid = call(caller, "request_payment", {**PAYMENT, "idempotency_key": payment_key})
    assert paid.error is None, paid.error
    age(IdempotencyRecord, 400)

    # when the purge runs
    report = retention.purge()

    # then the three records lost their arguments and results, not their rows, and each purge is an audit event
    assert report.purged["records"] == 3
    for record in IdempotencyRecord.objects.all():
        assert (record.arguments, record.result, record.purged_at is not None) == ({}, None, True)
    assert AuditEvent.objects.filter(action="record.purged").count() == 3

    # and each key follows its tool's expiry policy: the order runs again as a new one, the payment is held
    again = order(caller, "o-1")
    assert again.result["order_id"] != first_order["order_id"] and not again.replayed
    assert Order.objects.count() == 2
    held = call(caller, "request_payment", {**PAYMENT, "idempotency_key": payment_key})
    assert held.error.error_class == "expired"
    assert len(gateway.payments()) == 1

    # and the audit chain, purge events included, still verifies
    audit.seal()
    assert audit.verify_chain().ok
    out = StringIO()
    call_command("verify_audit_log", stdout=out)
    assert out.getvalue().startswith("OK: ")


def test_a_purged_key_is_found_where_its_tool_reads_the_raw_key_before_it_claims(transactional_db, caller):
    # given create_order's recent calls are mostly replays, so a call reads its key first (its raw form only:
    # claims.find_live(purged=False)), and an order whose key expired and was purged
    order(caller, "o-1")
    for _ in range(30):
        assert call(caller, "create_order", {**ORDER, "idempotency_key": "o-busy"}).error is None
    age(IdempotencyRecord, 400, key="o-1")
    assert retention.purge().purged["records"] == 1
    purged = IdempotencyRecord.objects.get(purged_at__isnull=False)

    # when the key is used again
    sent = []
    again = round_trips(lambda: sent.append(order(caller, "o-1")))

    # then the read found nothing under the raw key, and the call went on to find the purged record all the same:
    # the key followed its tool's expiry policy (retired, then run again as a new order), not a second live
    # record beside the purged one
    assert again[:2] == ["Sync", "Query BEGIN"]
    assert not sent[0].replayed and Order.objects.count() == 3
    purged.refresh_from_db()
    assert purged.retired_at is not None
    assert IdempotencyRecord.objects.filter(tenant_id=caller.tenant_id, tool="create_order",
                                            key__in=keys.stored_forms("o-1"), retired_at__isnull=True).count() == 1


def test_nothing_is_purged_before_its_retention_nor_a_record_whose_key_still_lives(transactional_db, caller):
    order(caller, "fresh")
    order(caller, "old-but-live")
    age(IdempotencyRecord, 40, key="old-but-live")
    IdempotencyRecord.objects.filter(key="old-but-live").update(expires_at=timezone.now() + timedelta(hours=1))

    assert retention.purge().total == 0
    assert IdempotencyRecord.objects.filter(purged_at__isnull=False).count() == 0


def test_a_tenants_override_wins_over_the_tools_declaration_and_the_setting(transactional_db, tenant, other_tenant):
    third = access.create_tenant("initech", "Initech")
    callers = [Caller(tenant_id=t.pk, actor="agent:test") for t in (tenant, other_tenant, third)]
    for number, caller in enumerate(callers):
        order(caller, f"o-{number}")
    age(IdempotencyRecord, 3)
    RetentionOverride.objects.create(tenant=tenant, tool="create_order", records=timedelta(days=2))
    RetentionOverride.objects.create(tenant=third, tool="", records=timedelta(days=1))

    report = retention.purge()

    purged = set(IdempotencyRecord.objects.filter(purged_at__isnull=False).values_list("tenant_id", flat=True))
    assert report.purged["records"] == 2 and purged == {tenant.pk, third.pk}  # globex keeps the 30-day default
    assert retention.kept_for("records", other_tenant.pk, "create_order") == timedelta(days=30)
    assert retention.kept_for("records", other_tenant.pk, "request_payment") == timedelta(days=365)  # the tool's
    assert retention.kept_for("records", third.pk, "request_payment") == timedelta(days=1)


def test_an_override_shorter_than_the_keys_retention_keeps_the_result_while_the_key_lives(transactional_db, tenant):
    RetentionOverride.objects.create(tenant=tenant, tool="create_order", records=timedelta(hours=1))

    assert retention.kept_for("records", tenant.pk, "create_order") == get_tool("create_order").retention_now()


def test_a_finished_tasks_data_checkpoints_and_document_go_each_at_its_own_retention(transactional_db, caller, fast):
    # given an ingested document whose task finished 10 days ago (documents: 1 year; artifacts: 7 days;
    # tasks: 30 days by default)
    result = call(caller, "start_task", {"tool": "ingest_document", "arguments": {"text": "Harbor pilots. " * 3000},
                                         "idempotency_key": "doc"})
    task = Task.objects.get(pk=result.result["task_id"])
    assert task_jobs.run_task(str(task.pk)) == "succeeded"
    assert TaskArtifact.objects.filter(task=task).exists()
    age(Task, 10)

    # when the purge runs
    first = retention.purge()

    # then only the checkpoints and artifacts went; the task keeps its data, the document stays searchable
    assert first.purged == {"records": 0, "tasks": 0, "artifacts": 1, "documents": 0, "audit_events": 0,
                            "confirmations": 0, "task_events": 0}
    assert not Checkpoint.objects.filter(task=task).exists() and not TaskArtifact.objects.filter(task=task).exists()
    task.refresh_from_db()
    assert task.result is not None and task.arguments and task.artifacts_purged_at is not None
    event = AuditEvent.objects.get(action="task.artifacts_purged", object_id=str(task.pk))
    assert event.after["checkpoints"] == 7 and event.actor == retention.PURGER

    # when a tenant shortens documents and tasks to a day
    override = RetentionOverride(tenant_id=caller.tenant_id, tasks=timedelta(days=1))
    override.set_period("documents", timedelta(days=1))  # the demo's own kind
    override.save()
    Document.objects.update(created_at=timezone.now() - timedelta(days=2))
    second = retention.purge()

    # then the document (chunks and vectors with it) and the task's data go; the task row stays
    assert (second.purged["documents"], second.purged["tasks"]) == (1, 1)
    assert not Document.objects.exists() and not DocumentChunk.objects.exists()
    task.refresh_from_db()
    assert (task.arguments, task.result, task.sealed_arguments) == ({}, None, "")
    assert call(caller, "search_documents", {"query": "harbor pilots"}).result["hits"] == []


def test_the_purge_works_in_batches_and_skips_rows_another_transaction_holds(transactional_db, caller, settings):
    override_conf(settings, retention_purge_batch=3)
    for number in range(7):
        order(caller, f"b-{number}")
    age(IdempotencyRecord, 40)
    held_key = "b-0"
    locked, release = threading.Event(), threading.Event()

    def hold_a_row():
        with transaction.atomic():
            IdempotencyRecord.objects.select_for_update().get(key=held_key)
            locked.set()
            release.wait(30)
        connection.close()

    holder = threading.Thread(target=hold_a_row)
    holder.start()
    locked.wait(10)
    try:
        count, batches = retention.purge_kind("records")
    finally:
        release.set()
        holder.join()

    assert (count, batches) == (6, 2)  # the locked row was skipped, not waited for
    assert IdempotencyRecord.objects.get(key=held_key).purged_at is None
    assert retention.purge_kind("records") == (1, 1)


def test_the_purge_is_scheduled_and_runs_as_a_command(transactional_db, caller):
    from django_q.models import Schedule

    from tools_app.schedules import ensure_schedules

    ensure_schedules()
    assert Schedule.objects.get(name="retention.purge").func == "tools_app.retention.jobs.purge_expired"
    order(caller, "cmd")
    age(IdempotencyRecord, 40)

    out = StringIO()
    call_command("purge_expired", stdout=out)

    assert "records: 1" in out.getvalue()


# --- overrides: who may change them ------------------------------------------------------------------


def test_changing_an_override_is_audited_with_the_periods_before_and_after(transactional_db, tenant):
    operator = make_operator("olga", OPERATOR, tenant)
    override = retention.save_override(operator, RetentionOverride(tenant=tenant, tool="create_order",
                                                                   records=timedelta(days=3)))
    before = RetentionOverride.objects.get(pk=override.pk)
    override.records = timedelta(days=5)

    retention.save_override(operator, override, before)

    event = AuditEvent.objects.filter(action="retention.override_changed").order_by("id").last()
    assert event.actor == "user:olga" and event.before["records"] == "3 days, 0:00:00"
    assert event.after == {"tool": "create_order", "records": "5 days, 0:00:00", "tasks": None, "artifacts": None,
                           "documents": None}  # the demo's kind (installed here) too


def test_an_operator_of_another_tenant_or_an_auditor_cannot_change_an_override(transactional_db, tenant,
                                                                               other_tenant):
    outsider = make_operator("otto", OPERATOR, other_tenant)
    auditor = make_operator("aude", AUDITOR, tenant)

    for who in (outsider, auditor):
        with pytest.raises(PermissionDenied):
            retention.save_override(who, RetentionOverride(tenant=tenant, records=timedelta(days=1)))

    assert not RetentionOverride.objects.exists()
    assert AuditEvent.objects.filter(action="retention.change_refused").count() == 2


def test_a_crafted_admin_request_for_a_tenant_the_operator_may_not_see_is_refused(transactional_db, client, tenant,
                                                                                   other_tenant):
    outsider = make_operator("otto", OPERATOR, other_tenant)
    client.force_login(outsider)

    form = client.get(reverse("admin:tools_app_retentionoverride_add"))
    response = client.post(reverse("admin:tools_app_retentionoverride_add"), {
        "tenant": tenant.pk, "tool": "", "records": "1 00:00:00"})

    # the form offers only the operator's own tenant, and a POST naming another changes nothing
    choices = [str(pk) for pk, _ in form.context["adminform"].form.fields["tenant"].choices if pk]
    assert choices == [str(other_tenant.pk)]
    assert response.status_code == 200 and "tenant" in response.context["adminform"].form.errors
    assert not RetentionOverride.objects.exists()
    assert not AuditEvent.objects.filter(action="retention.override_changed").exists()
    client.force_login(make_operator("olga", OPERATOR, tenant))
    response = client.post(reverse("admin:tools_app_retentionoverride_add"), {
        "tenant": tenant.pk, "tool": "", "records": "1 00:00:00"})
    assert response.status_code == 302
    assert RetentionOverride.objects.get().records == timedelta(days=1)
    assert AuditEvent.objects.filter(action="retention.override_changed", actor="user:olga").exists()
