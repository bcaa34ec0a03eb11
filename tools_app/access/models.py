from django.db import models


class Tenant(models.Model):
    """An isolated customer of idemops: every record, key and token belongs to one."""

    slug = models.SlugField(max_length=63, unique=True)
    name = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug


class ApiToken(models.Model):
    """A tenant's bearer token for /mcp. Only a SHA-256 digest is stored.

    The raw token is shown once, when it is issued (tools_app.access.tokens.issue_token).
    Tokens are 256-bit random strings, so an unsalted digest is safe to index.
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="tokens")
    name = models.CharField(max_length=100, help_text="The agent identity this token stands for.")
    digest = models.CharField(max_length=64, unique=True, editable=False)
    prefix = models.CharField(max_length=12, editable=False, help_text="First characters, to recognise a token.")
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "name"], name="token_name_unique_per_tenant")]

    def __str__(self) -> str:
        return f"{self.tenant.slug}/{self.name} ({self.prefix}…)"

    @property
    def agent_identity(self) -> str:
        """How this caller appears in audit events and approval requests."""
        return f"agent:{self.tenant.slug}/{self.name}"


class TenantAccess(models.Model):
    """Grants a Django user (operator, approver or auditor) one tenant.

    Superusers see every tenant; any other user sees only the tenants granted
    here (see tools_app.access.scope).
    """

    user = models.ForeignKey("auth.User", on_delete=models.CASCADE, related_name="tenant_access")
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="access")
    granted_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name_plural = "tenant access"
        constraints = [models.UniqueConstraint(fields=["user", "tenant"], name="tenant_access_once")]

    def __str__(self) -> str:
        return f"{self.user} → {self.tenant}"


class AuditorKey(models.Model):
    """An auditor's key for the read-only REST API. Only a SHA-256 digest is stored.

    The raw key is shown once, when it is issued (tools_app.access.auditors.issue_key).
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
