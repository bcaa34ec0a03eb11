"""The console's pages of the audit log's upkeep: each tenant's audit retention (listed to operators and auditors,
changed by operators only, through retention.set_audit_retention, audited), and, read-only to auditors, the
checkpoints of verification and the archives with the hashes they link from and to and their files.

Crafted requests: a person whose role lacks the permission gets 403 on the list and on a POST, and no row
changes; a permitted change leaves exactly one audit event."""

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from tests.support.api_support import make_event
from tests.support.operators import make_operator
from tools_app import retention
from tools_app.access.roles import APPROVER, AUDITOR, OPERATOR
from tools_app.conf import override_conf
from tools_app.core import audit
from tools_app.models import AuditArchive, AuditCheckpoint, AuditEvent, AuditRetention

PAGES = ["auditretention", "auditcheckpoint", "auditarchive"]


def changelist(name: str) -> str:
    return reverse(f"admin:tools_app_{name}_changelist")


def changes(tenant) -> list:
    """What a refused request must leave as it was: the policies and their audit events."""
    return [list(AuditRetention.objects.order_by("pk").values_list("tenant_id", "keep_days")),
            AuditEvent.objects.filter(action="retention.audit_changed").count()]


@pytest.fixture
def policy(tenant):
    return retention.set_audit_retention(make_operator("setter", OPERATOR, tenant), tenant, 400)


@pytest.fixture
def archived(settings, tmp_path, tenant):
    """A checkpoint and an archive made as production makes them: events sealed, verified, then archived."""
    override_conf(settings, audit_archive_dir=tmp_path, audit_retention_days=30)
    AuditRetention.objects.create(tenant=tenant, keep_days=30)
    for i in range(3):
        make_event(tenant, object_id=str(i))
    audit.seal()
    assert audit.verify_incrementally(every=2).ok
    assert retention.purge(now=timezone.now() + timedelta(days=40)).purged["audit_events"] > 0
    return AuditArchive.objects.get()


@pytest.mark.parametrize("name", PAGES)
def test_a_person_whose_role_lacks_the_permission_gets_403_on_each_audit_log_page(client, tenant, name):
    client.force_login(make_operator("abe", APPROVER, tenant))

    assert client.get(changelist(name)).status_code == 403


def test_an_auditor_sees_the_policies_the_checkpoints_and_the_archives_with_their_hashes_and_file(
        client, tenant, archived):
    client.force_login(make_operator("ada", AUDITOR, tenant))
    checkpoint = AuditCheckpoint.objects.first()

    policies = client.get(changelist("auditretention"))
    checkpoints = client.get(changelist("auditcheckpoint"))
    archives = client.get(changelist("auditarchive"))

    assert (policies.status_code, checkpoints.status_code, archives.status_code) == (200, 200, 200)
    assert checkpoint is not None and checkpoint.last_hash in checkpoints.text
    for shown in (archived.first_prev_hash, archived.last_hash, archived.path):
        assert shown in archives.text
    assert "30" in policies.text and str(tenant) in policies.text


def test_the_checkpoints_and_archives_pages_offer_no_change_to_anyone(client, tenant, archived):
    client.force_login(make_operator("ada", AUDITOR, tenant))
    before = (list(AuditCheckpoint.objects.values_list("pk", "last_hash")),
              list(AuditArchive.objects.values_list("pk", "last_hash", "path")))

    answers = [client.post(reverse("admin:tools_app_auditcheckpoint_add"), {"first_seq": "1", "last_seq": "9"}),
               client.post(reverse("admin:tools_app_auditarchive_change", args=[archived.pk]), {"path": "/tmp/x"}),
               client.post(reverse("admin:tools_app_auditarchive_delete", args=[archived.pk]), {"post": "yes"})]

    assert [answer.status_code for answer in answers] == [403, 403, 403]
    assert (list(AuditCheckpoint.objects.values_list("pk", "last_hash")),
            list(AuditArchive.objects.values_list("pk", "last_hash", "path"))) == before


def test_an_approver_cannot_see_or_set_a_tenants_audit_retention_by_a_crafted_post(client, tenant, policy):
    client.force_login(make_operator("abe", APPROVER, tenant))
    before = changes(tenant)

    add = client.post(reverse("admin:tools_app_auditretention_add"), {"tenant": tenant.pk, "keep_days": "1"})
    change = client.post(reverse("admin:tools_app_auditretention_change", args=[policy.pk]), {"keep_days": "1"})

    assert (add.status_code, change.status_code) == (403, 403)
    assert changes(tenant) == before


def test_an_auditor_sees_the_policy_but_a_crafted_post_changing_it_is_refused(client, tenant, policy):
    client.force_login(make_operator("ada", AUDITOR, tenant))
    before = changes(tenant)

    page = client.get(reverse("admin:tools_app_auditretention_change", args=[policy.pk]))
    change = client.post(reverse("admin:tools_app_auditretention_change", args=[policy.pk]), {"keep_days": "1"})
    add = client.post(reverse("admin:tools_app_auditretention_add"), {"tenant": tenant.pk, "keep_days": "1"})

    assert page.status_code == 200 and 'name="keep_days"' not in page.text  # shown, not offered for change
    assert (change.status_code, add.status_code) == (403, 403)
    assert changes(tenant) == before


def test_an_operator_changes_the_audit_retention_and_the_change_is_audited_with_the_days_before_and_after(
        client, tenant, policy):
    client.force_login(make_operator("olga", OPERATOR, tenant))

    answer = client.post(reverse("admin:tools_app_auditretention_change", args=[policy.pk]), {"keep_days": "3650"})

    assert answer.status_code == 302
    assert list(AuditRetention.objects.values_list("tenant_id", "keep_days")) == [(tenant.pk, 3650)]
    (event,) = AuditEvent.objects.filter(action="retention.audit_changed", actor="user:olga")
    assert (event.tenant_id, event.before, event.after) == (tenant.pk, {"keep_days": 400}, {"keep_days": 3650})


def test_an_operator_adds_a_policy_for_their_tenant_but_not_for_another_nor_without_a_second_factor(
        client, tenant, other_tenant):
    outsider = make_operator("otto", OPERATOR, other_tenant)
    client.force_login(outsider)
    crafted = client.post(reverse("admin:tools_app_auditretention_add"), {"tenant": tenant.pk, "keep_days": "1"})
    client.force_login(make_operator("olga", OPERATOR, tenant), second_factor=False)
    password_only = client.post(reverse("admin:tools_app_auditretention_add"),
                                {"tenant": tenant.pk, "keep_days": "1"})
    assert crafted.status_code == 200 and "tenant" in crafted.context["adminform"].form.errors
    assert password_only.status_code == 403
    assert not AuditRetention.objects.exists()
    assert not AuditEvent.objects.filter(action="retention.audit_changed").exists()
    assert AuditEvent.objects.filter(action="retention.change_refused", actor="user:olga").count() == 1

    client.force_login(make_operator("olga2", OPERATOR, tenant))
    added = client.post(reverse("admin:tools_app_auditretention_add"), {"tenant": tenant.pk, "keep_days": "90"})

    assert added.status_code == 302
    assert list(AuditRetention.objects.values_list("tenant_id", "keep_days")) == [(tenant.pk, 90)]
    assert AuditEvent.objects.filter(action="retention.audit_changed", actor="user:olga2").count() == 1
