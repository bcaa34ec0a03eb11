"""Tenants: the isolated customers of idemops. Every record, key and token belongs to one."""

from __future__ import annotations

from django.db import transaction

from tools_app.access.models import Tenant
from tools_app.core import audit


@transaction.atomic
def create_tenant(slug: str, name: str = "", *, actor: str = audit.SYSTEM) -> Tenant:
    tenant = Tenant.objects.create(slug=slug, name=name or slug)
    audit.record_event(action="tenant.created", obj=tenant, actor=actor, tenant_id=tenant.pk)
    return tenant
