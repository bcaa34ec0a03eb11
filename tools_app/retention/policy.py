"""Which retention applies to a tenant's tool; operators' changes of a tenant's overrides and audit retention."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

from django.db import transaction

from tools_app import access
from tools_app.conf import conf
from tools_app.core import audit
from tools_app.retention.models import AuditRetention, RetentionOverride
from tools_app.toolkit.registry import ToolSpec, all_tools

if TYPE_CHECKING:
    from django.contrib.auth.models import AnonymousUser, User

    from tools_app.access.models import Tenant

# The platform's own kinds, each with its IDEMOPS_RETENTION_<KIND>_HOURS setting and a column of RetentionOverride.
KINDS = ("records", "tasks", "artifacts")


@dataclass(frozen=True)
class AppKind:
    """An app's own retention kind (purge.register_retained): its default period (the app's setting) and
    what it keeps, in words. A tenant's override of it lives in RetentionOverride.app_kinds."""

    default: Callable[[], timedelta]
    description: str


APP_KINDS: dict[str, AppKind] = {}


def kinds() -> tuple[str, ...]:
    """Every retention kind: the platform's, then the installed apps' (in registration order)."""
    return (*KINDS, *APP_KINDS)

CHANGE_RETENTION = access.Permit("tools_app.manage_retention", "change_retention",
                                 "change a tenant's retention", "retention.change_refused")


def default_for(kind: str, spec: ToolSpec | None) -> timedelta:
    """The tool's own period for `kind`, else the setting's (an app's kind: the app's default)."""
    declared = spec.keep.period(kind) if spec is not None else None
    period = declared if declared is not None else (
        timedelta(hours=getattr(conf(), f"retention_{kind}_hours")) if kind in KINDS else APP_KINDS[kind].default())
    if kind == "records" and spec is not None:
        period = max(period, spec.retention_now())  # a replay needs the result as long as the key lives
    return period


# (tenant id, tool or "") -> period
Overrides = dict[tuple[int, str], timedelta]


def kept_for(kind: str, tenant_id: int, tool: str, overrides: Overrides | None = None) -> timedelta:
    """How long `kind` of `tool`'s calls is kept for this tenant (an override, the tool's, the setting's)."""
    if overrides is None:
        overrides = load_overrides(kind)
    spec = next((spec for spec in all_tools() if spec.name == tool), None) if tool else None
    chosen = overrides.get((tenant_id, tool), overrides.get((tenant_id, "")))
    if chosen is None:
        return default_for(kind, spec)
    if kind == "records" and spec is not None:
        return max(chosen, spec.retention_now())  # a replay needs the result as long as the key lives
    return chosen


def load_overrides(kind: str) -> Overrides:
    """(tenant id, tool or "") -> period, for the overrides that set `kind`."""
    if kind not in KINDS:  # an app's kind: seconds under its name in app_kinds
        return {(tenant_id, tool): timedelta(seconds=periods[kind]) for tenant_id, tool, periods in
                RetentionOverride.objects.filter(app_kinds__has_key=kind).values_list("tenant_id", "tool", "app_kinds")}
    return {(tenant_id, tool): period for tenant_id, tool, period in
            RetentionOverride.objects.filter(**{f"{kind}__isnull": False}).values_list("tenant_id", "tool", kind)}


def _state(override: RetentionOverride) -> dict[str, str | None]:
    return {"tool": override.tool or "*", **{kind: _text(override.period(kind)) for kind in kinds()}}


def _text(period: timedelta | None) -> str | None:
    return None if period is None else str(period)


def save_override(who: User | AnonymousUser, override: RetentionOverride,
                  before: RetentionOverride | None = None) -> RetentionOverride:
    """Create or change a tenant's override (whoever asks must hold CHANGE_RETENTION on the tenant);
    the audit event, with the periods before and after, commits with the change."""
    actor = access.authorize(who, CHANGE_RETENTION, override)
    with transaction.atomic():
        override.save()
        audit.record_event(action="retention.override_changed", obj=override, actor=actor,
                           before=_state(before) if before is not None else None, after=_state(override))
    return override


def delete_override(who: User | AnonymousUser, override: RetentionOverride) -> None:
    actor = access.authorize(who, CHANGE_RETENTION, override)
    with transaction.atomic():
        audit.record_event(action="retention.override_deleted", obj=override, actor=actor, before=_state(override))
        override.delete()


def set_audit_retention(who: User | AnonymousUser, tenant: Tenant, keep_days: int) -> AuditRetention:
    """Set how long `tenant`'s audit events are kept (0: for ever); whoever asks must hold CHANGE_RETENTION on
    the tenant. The audit event, with the days before and after, commits with the change."""
    actor = access.authorize(who, CHANGE_RETENTION, AuditRetention(tenant=tenant))
    with transaction.atomic():
        policy = AuditRetention.objects.select_for_update().filter(tenant=tenant).first()
        before = {"keep_days": policy.keep_days} if policy is not None else None
        policy = policy or AuditRetention(tenant=tenant)
        policy.keep_days = keep_days
        policy.save()
        audit.record_event(action="retention.audit_changed", obj=policy, actor=actor, before=before,
                           after={"keep_days": keep_days})
    return policy
