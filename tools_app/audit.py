"""The audit log: append-only events written in the transaction of the change.

`record_event` is called by every state-changing function (the engine,
approvals, reconciliation, operator actions) inside its transaction, so an
event exists if and only if the change committed.
"""

from __future__ import annotations

from typing import Any

from django.db import models
from django.utils import timezone

from tools_app.models import AuditEvent

SYSTEM = "system"


def record_event(
    *,
    action: str,
    obj: models.Model,
    actor: str,
    tenant_id: int | None = None,
    before: dict[str, Any] | None = None,
    after: dict[str, Any] | None = None,
    reason: str = "",
    trace_id: str = "",
) -> AuditEvent:
    return AuditEvent.objects.create(
        tenant_id=tenant_id if tenant_id is not None else getattr(obj, "tenant_id", None),
        actor=actor,
        action=action,
        object_type=obj._meta.model_name,
        object_id=str(obj.pk),
        before=before,
        after=after,
        reason=reason,
        trace_id=trace_id,
        created_at=timezone.now(),
    )
