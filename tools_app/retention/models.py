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
    documents = models.DurationField(null=True, blank=True, help_text="Ingested documents, from their creation.")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "tool"], name="one_override_per_tenant_tool")]
        # One permission for add, change and delete: every change goes through retention.save_override /
        # delete_override, audited, so no role needs Django's add/change/delete permissions.
        permissions = [("manage_retention", "Can set a tenant's retention overrides")]

    def __str__(self) -> str:
        return f"retention of {self.tenant} for {self.tool or 'every tool'}"
