"""The operators' roles: Django groups with the least permissions each needs.

Declared here; `ensure_roles` (run after every migrate) creates the groups
and sets their permissions to exactly this list. A role gives permissions;
TenantAccess gives tenants (a non-superuser sees only the tenants granted).
"""

from __future__ import annotations

from django.apps import apps
from django.contrib.auth.management import create_permissions
from django.contrib.auth.models import Group, Permission, User
from django.db import transaction

from tools_app.access.authorization import forget_visible_tenants
from tools_app.access.models import Tenant, TenantAccess
from tools_app.core import audit

OPERATOR, APPROVER, AUDITOR = "operator", "approver", "auditor"

# Codenames in tools_app. Add a queue's view/action permissions here when it is added. An installed app
# adds its own models' permissions to a role with `idemops_role_permissions` on its AppConfig,
# {role: [codename, ...]} (the demo: operators and approvers see the orders a payment would touch).
ROLE_ATTRIBUTE = "idemops_role_permissions"
ROLE_PERMISSIONS: dict[str, list[str]] = {
    # Watches the queues and the dashboard, looks into records, frees stuck keys.
    OPERATOR: [
        "view_dashboard", "view_approvalqueue", "view_approvalrequest", "view_idempotencyrecord",
        "force_expire_idempotencyrecord", "release_held_key", "view_auditevent",
        "view_unknownoutcomequeue", "resolve_unknown", "view_outboxevent", "view_deadletter", "redrive_outboxevent",
        "view_task", "view_taskneedingattention", "manage_task",
        "view_tenantlimits", "set_tenant_limits", "view_tenant", "rotate_webhooksecret",
        "view_notificationchannel", "manage_notificationchannel",
        "view_retentionoverride", "manage_retention", "view_auditretention", "connect_agent", "view_agentconnection",
        "view_downstream", "pause_operations", "view_bulkaction", "run_bulk_action",
        "view_scheduledoperation", "manage_schedules", "view_personal_values",
    ],
    # Decides on sensitive operations; sees what they would touch.
    APPROVER: [
        "view_dashboard", "view_approvalqueue", "view_approvalrequest", "decide_approvalrequest",
        "view_idempotencyrecord", "connect_agent", "view_agentconnection", "view_personal_values",
    ],
    # Reads everything that is evidence; changes nothing.
    AUDITOR: [
        "view_dashboard", "view_auditevent", "view_auditseal", "view_idempotencyrecord", "view_approvalrequest",
        "view_approvaldecision", "view_outboxevent", "use_auditor_api", "view_task", "view_retentionoverride",
        "view_auditretention", "view_auditcheckpoint", "view_auditarchive",
    ],
}


def ensure_roles(**kwargs: object) -> None:
    wanted = {role: {"tools_app": codenames} for role, codenames in ROLE_PERMISSIONS.items()}
    for config in apps.get_app_configs():
        for role, codenames in getattr(config, ROLE_ATTRIBUTE, {}).items():
            if role not in wanted:
                raise LookupError(f"app {config.name}: {ROLE_ATTRIBUTE} names unknown role {role!r}")
            wanted[role][config.label] = codenames
            # post_migrate reaches apps in order: this app's permissions may not be made yet.
            create_permissions(config, verbosity=0)
    for role, by_app in wanted.items():
        group, _ = Group.objects.get_or_create(name=role)
        chosen = []
        for label, codenames in by_app.items():
            permissions = list(Permission.objects.filter(content_type__app_label=label, codename__in=codenames))
            missing = set(codenames) - {permission.codename for permission in permissions}
            if missing:  # a typo here would silently weaken or break a role
                raise LookupError(f"role {role}: unknown permissions of {label}: {sorted(missing)}")
            chosen += permissions
        group.permissions.set(chosen)


@transaction.atomic
def grant(user: User, role: str, tenant_slugs: list[str], *, actor: str) -> None:
    """Make `user` a staff member with `role` on the given tenants (all tenants needs a superuser)."""
    if role not in ROLE_PERMISSIONS:
        raise ValueError(f"unknown role {role!r}; roles are {', '.join(ROLE_PERMISSIONS)}")
    if not user.is_staff:
        user.is_staff = True
        user.save(update_fields=["is_staff"])
    user.groups.add(Group.objects.get(name=role))
    for slug in tenant_slugs:
        tenant = Tenant.objects.get(slug=slug)
        access, created = TenantAccess.objects.get_or_create(user=user, tenant=tenant)
        if created:
            audit.record_event(action="tenant_access.granted", obj=access, actor=actor, tenant_id=tenant.pk,
                               after={"user": user.get_username(), "role": role})
    forget_visible_tenants(user)
    audit.record_event(action="role.granted", obj=user, actor=actor, tenant_id=None,
                       after={"user": user.get_username(), "role": role, "tenants": sorted(tenant_slugs)})
