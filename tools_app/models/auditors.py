from django.db import models


class AuditorKey(models.Model):
    """An auditor's key for the read-only REST API. Only a SHA-256 digest is stored.

    The raw key is shown once, when it is issued (tools_app.auditors.issue_key).
    A key sees exactly the tenants granted to it; revoking it is final.
    """

    name = models.CharField(max_length=100, unique=True, help_text="Who holds the key (a person or an audit system).")
    tenants = models.ManyToManyField("tools_app.Tenant", related_name="auditor_keys", blank=True,
                                     help_text="The tenants whose records this key may read.")
    digest = models.CharField(max_length=64, unique=True, editable=False)
    prefix = models.CharField(max_length=12, editable=False, help_text="First characters, to recognise a key.")
    created_at = models.DateTimeField(auto_now_add=True)
    created_by = models.CharField(max_length=200, blank=True, editable=False)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        permissions = [("use_auditor_api", "Can read and export records through the auditors' REST API")]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @property
    def auditor_identity(self) -> str:
        """How this key appears in audit events."""
        return f"auditor:{self.name}"
