"""Auditors: who may read the exports, and which tenants they see.

Two kinds of auditor reach the REST API (tools_app/api/):
- an **auditor key** (`AuditorKey`): a random bearer key granted to a set of
  tenants, shown once at issue and stored only as a SHA-256 digest (secrets.py,
  like agents' API tokens);
- a **Django user** logged in with a session, holding the
  `tools_app.use_auditor_api` permission (the `auditor` group has it) and
  scoped by `TenantAccess` like every other non-superuser.

Issuing, granting and revoking are audited in the same transaction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import transaction

from tools_app.access import secrets
from tools_app.access.models import AuditorKey, Tenant
from tools_app.core import audit

KEY_PREFIX = "ida_"
PERMISSION = "tools_app.use_auditor_api"
GROUP_NAME = "auditor"


# --- keys: one function per state change --------------------------------------


@transaction.atomic
def issue_key(name: str, tenant_list: list[Tenant], *, actor: str) -> tuple[AuditorKey, str]:
    """Create a key granted to `tenant_list`; the raw value is returned here and never again."""
    issued = secrets.new(KEY_PREFIX)
    key = AuditorKey.objects.create(name=name, digest=issued.digest, prefix=issued.prefix, created_by=actor)
    key.tenants.set(tenant_list)
    audit.record_event(action="auditor_key.issued", obj=key, actor=actor,
                       after={"name": name, "prefix": key.prefix, "tenants": sorted(t.slug for t in tenant_list)})
    return key, issued.raw


@transaction.atomic
def set_tenants(key: AuditorKey, tenant_list: list[Tenant], *, actor: str) -> bool:
    """Replace the tenants a key may read. Returns False when nothing changed."""
    # Lock the key so two concurrent edits cannot both read the same "before".
    AuditorKey.objects.select_for_update().get(pk=key.pk)
    before = sorted(key.tenants.values_list("slug", flat=True))
    after = sorted(t.slug for t in tenant_list)
    if before == after:
        return False
    key.tenants.set(tenant_list)
    audit.record_event(action="auditor_key.tenants_changed", obj=key, actor=actor,
                       before={"tenants": before}, after={"tenants": after})
    return True


def revoke_key(key: AuditorKey, *, actor: str, reason: str = "") -> bool:
    """Revoke a live key; a revoked key stays revoked."""
    return secrets.revoke(key, action="auditor_key.revoked", actor=actor, reason=reason)


# --- who is asking --------------------------------------------------------------


@dataclass(frozen=True)
class KeyAuditor:
    """request.user for a request authenticated by an auditor key."""

    key: AuditorKey
    tenant_ids: frozenset[int]

    is_authenticated = True
    is_anonymous = False
    is_active = True
    is_staff = False
    is_superuser = False

    @property
    def identity(self) -> str:
        return self.key.auditor_identity

    def __str__(self) -> str:
        return self.identity


def authenticate_key(raw_key: str) -> KeyAuditor | None:
    """The auditor for a raw key, or None for an unknown or revoked key."""
    key = secrets.find(AuditorKey.objects.all(), raw_key, KEY_PREFIX)
    if key is None:
        return None
    return KeyAuditor(key=key, tenant_ids=frozenset(key.tenants.values_list("id", flat=True)))


def may_use_api(user: Any) -> bool:
    if isinstance(user, KeyAuditor):
        return True
    return bool(user and user.is_authenticated and user.is_active and user.has_perm(PERMISSION))


def identity(user: Any) -> str:
    """How an auditor appears in audit events."""
    if isinstance(user, KeyAuditor):
        return user.identity
    return audit.user_actor(user)


def record_export(user: Any, resource: str, filters: dict[str, str]) -> None:
    """Exports are reads, but who took a copy of which records is itself audit data."""
    obj = user.key if isinstance(user, KeyAuditor) else user
    audit.record_event(action="api.exported", obj=obj, actor=identity(user), tenant_id=None,
                       after={"resource": resource, "filters": filters})
