"""Upgrading past 0005 (the queue proxies renamed UnknownOutcomeQueue and ApprovalQueue): whoever saw
the queues before still sees them, through their role or a permission given to them in person."""

import pytest
from django.contrib.auth.models import Group, Permission, User
from django.contrib.contenttypes.models import ContentType
from django.core.management import call_command
from django.core.management.sql import emit_pre_migrate_signal
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.test import Client
from django.urls import reverse

from tests.support.operators import make_operator
from tools_app.access.roles import APPROVER, OPERATOR
from tools_app.models import TenantAccess

BEFORE = ("tools_app", "0004_i22_names_lowercase_statuses")
UNKNOWN_QUEUE = reverse("admin:tools_app_unknownoutcomequeue_changelist")
APPROVAL_QUEUE = reverse("admin:tools_app_approvalqueue_changelist")


def unapply_the_rename() -> None:
    """Back to the database as the release before left it: what `migrate tools_app 0004` does, without
    its post_migrate (which would build this release's permissions beside the old ones)."""
    executor = MigrationExecutor(connection)
    plan = executor.migration_plan([BEFORE])
    unapplied = [migration.name for migration, backwards in plan if backwards]
    assert unapplied[-1] == "0005_i22_queues_rename_queue_models", unapplied  # and the later ones before it
    state = executor._create_project_state(with_applied_migrations=True)
    emit_pre_migrate_signal(0, False, connection.alias, apps=state.apps, plan=plan)  # renames the content types
    executor.migrate([BEFORE], plan=plan, state=state.clone())
    ContentType.objects.clear_cache()


def sees(user: User, url: str) -> bool:
    client = Client()
    client.force_login(User.objects.get(pk=user.pk))  # fresh: no permissions cached from before
    return client.get(url).status_code == 200


@pytest.mark.django_db(transaction=True)
def test_role_holders_and_personal_grants_still_see_the_queues_after_the_rename_migration(tenant):
    olga, bob = make_operator("olga", OPERATOR, tenant), make_operator("bob", APPROVER, tenant)
    vera = User.objects.create_user("vera", is_staff=True)
    TenantAccess.objects.create(user=vera, tenant=tenant)
    try:
        unapply_the_rename()
        # given: the old names, and the grants on them (the role's and vera's own)
        vera.user_permissions.add(Permission.objects.get(codename="view_unknownoutcome"))
        assert set(ContentType.objects.filter(app_label="tools_app", model__in=[
            "unknownoutcome", "pendingapproval", "unknownoutcomequeue", "approvalqueue"]).values_list(
                "model", flat=True)) == {"unknownoutcome", "pendingapproval"}
        assert User.objects.get(pk=olga.pk).has_perm("tools_app.view_unknownoutcome")
        assert User.objects.get(pk=bob.pk).has_perm("tools_app.view_pendingapproval")
        permissions_before = Permission.objects.count()

        call_command("migrate", "tools_app", verbosity=0)  # with post_migrate, as `idemops migrate` runs it
    finally:
        call_command("migrate", verbosity=0)  # never leave the test database behind

    assert not Permission.objects.filter(codename__regex=r"_(unknownoutcome|pendingapproval)$").exists()
    assert Permission.objects.count() == permissions_before  # renamed in place, none made beside them
    assert Group.objects.get(name=OPERATOR).permissions.filter(codename="view_unknownoutcomequeue").exists()
    assert sees(olga, UNKNOWN_QUEUE) and sees(olga, APPROVAL_QUEUE)
    assert sees(bob, APPROVAL_QUEUE) and not sees(bob, UNKNOWN_QUEUE)
    assert sees(vera, UNKNOWN_QUEUE) and not sees(vera, APPROVAL_QUEUE)
