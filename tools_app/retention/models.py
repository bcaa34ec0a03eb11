from datetime import timedelta

from django.db import models


class RetentionOverride(models.Model):
    """A tenant's own retention for one tool (or, with no tool, for every tool): wins over the tool's.

    Each period is optional (empty: the tool's, or the setting's). Changes go through
    retention.save_override / delete_override: permission-checked and audited.
    """

    tenant = models.ForeignKey("tools_app.Tenant", on_delete=models.CASCADE, related_name="retention_overrides")
    tool = models.CharField(max_length=100, blank=True, help_text="Empty: every tool of the tenant.")
    records = models.DurationField(null=True, blank=True, help_text="Arguments and results of finished records "
                                                                    "(never less than the key's retention).")
    tasks = models.DurationField(null=True, blank=True, help_text="Arguments, results and answers of finished tasks.")
    artifacts = models.DurationField(null=True, blank=True,
                                     help_text="Checkpoints, step batches and artifacts of finished tasks.")
    # An app's own kinds (retention.register_retained: the demo's documents), kind -> seconds.
    app_kinds = models.JSONField(default=dict, blank=True,
                                 help_text="Periods of the apps' own retention kinds, in seconds, by kind.")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "tool"], name="one_override_per_tenant_tool")]
        # One permission for add, change and delete: every change goes through retention.save_override /
        # delete_override, audited, so no role needs Django's add/change/delete permissions.
        permissions = [("manage_retention", "Can set a tenant's retention overrides")]

    def __str__(self) -> str:
        return f"retention of {self.tenant} for {self.tool or 'every tool'}"

    def period(self, kind: str) -> timedelta | None:
        """This override's period for `kind` (the platform's or an app's), or None."""
        if kind in ("records", "tasks", "artifacts"):
            period: timedelta | None = getattr(self, kind)
            return period
        seconds = self.app_kinds.get(kind)
        return None if seconds is None else timedelta(seconds=seconds)

    def set_period(self, kind: str, period: timedelta | None) -> None:
        if kind in ("records", "tasks", "artifacts"):
            setattr(self, kind, period)
        elif period is None:
            self.app_kinds = {k: v for k, v in self.app_kinds.items() if k != kind}
        else:
            self.app_kinds = {**self.app_kinds, kind: period.total_seconds()}


class AuditRetention(models.Model):
    """How long a tenant's audit events are kept (IDEMOPS_AUDIT_RETENTION_DAYS without one).

    Separate from RetentionOverride: evidence of who did what usually outlives the calls'
    data. Changes go through retention.set_audit_retention (permission-checked, audited).
    The chain is one sequence over every tenant, so events leave only as an unbroken
    prefix: an event is archived when it and every event before it are past their
    tenants' retention (tools_app/retention/audit_archive.py).
    """

    tenant = models.OneToOneField("tools_app.Tenant", on_delete=models.CASCADE, related_name="audit_retention")
    keep_days = models.PositiveIntegerField(help_text="Days an event is kept from its creation; 0: for ever.")
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"audit retention of {self.tenant}"
