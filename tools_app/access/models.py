from django.conf import settings
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


# How an agent appears in audit events and approval requests: agent:<tenant slug>/<token name>.
AGENT = "agent:"


class ApiToken(models.Model):
    """A tenant's bearer token for /mcp. Only a SHA-256 digest is stored.

    The raw token is shown once, when it is issued (tools_app.access.tokens.issue_token).
    Tokens are 256-bit random strings, so an unsalted digest is safe to index.
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="tokens")
    name = models.CharField(max_length=100, help_text="The agent identity this token stands for.")
    # Four eyes: the owner never approves what this agent asks for (tools_app.approvals.decisions).
    # Empty only for tokens issued before owners existed (manage.py set_token_owner gives them one).
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, blank=True,
                              related_name="agent_tokens",
                              help_text="The person responsible for this agent; they cannot approve its requests.")
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
        return f"{AGENT}{self.tenant.slug}/{self.name}"


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


class AgentConnection(models.Model):
    """A person's consent that an OAuth client (an MCP host) acts for them on one tenant.

    Made on the console's consent page (`tools_app.access.oauth.connect`). The tokens the client gets
    are the person's (django-oauth-toolkit's AccessToken.user): four eyes holds, so that person
    never approves what this agent asks for. Revoking it revokes every token of the client for them.
    """

    user = models.ForeignKey("auth.User", on_delete=models.CASCADE, related_name="agent_connections")
    application = models.ForeignKey("oauth2_provider.Application", on_delete=models.CASCADE, related_name="+")
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="agent_connections")
    scopes = models.CharField(max_length=200, help_text="The scopes the person granted (read, write, long).")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "application"], name="one_connection_per_client")]
        permissions = [("connect_agent", "Can connect an agent (an OAuth client) to a tenant")]

    def __str__(self) -> str:
        return f"{self.application} for {self.user} on {self.tenant}"

    @property
    def agent_identity(self) -> str:
        """How this agent appears in audit events and approval requests."""
        return f"{AGENT}{self.tenant.slug}/{OAUTH_AGENT}{self.pk}"


# An OAuth agent's name in its identity (agent:<tenant>/oauth:<connection id>); no API token's name has ':'.
OAUTH_AGENT = "oauth:"


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


class WebhookSecret(models.Model):
    """A tenant's webhook signing secret (Standard Webhooks), sealed: it must be read back to sign
    (tools_app.access.webhook_secrets). Shown once, when it is created or rotated."""

    tenant = models.OneToOneField(Tenant, on_delete=models.CASCADE, related_name="webhook_secret")
    # {"current": "whsec_…", "previous": "whsec_…"?} encrypted (core.redaction.seal); "" before the first.
    sealed = models.TextField(blank=True, editable=False)
    prefix = models.CharField(max_length=12, blank=True, editable=False,
                              help_text="First characters of the current secret, to recognise it.")
    rotated_at = models.DateTimeField(null=True, blank=True, editable=False)
    previous_valid_until = models.DateTimeField(
        null=True, blank=True, editable=False,
        help_text="Until then webhooks are signed with the previous secret too, so receivers can switch.")

    class Meta:
        permissions = [("rotate_webhooksecret", "Can create or rotate a tenant's webhook signing secret")]

    def __str__(self) -> str:
        return f"webhook secret of {self.tenant}" + (f" ({self.prefix}…)" if self.prefix else "")


class TenantLimits(models.Model):
    """Per-tenant limits on what its agents may ask at once. A tenant without a row, or an empty
    field, uses the default setting (IDEMOPS_RATE_LIMIT_*, IDEMOPS_MAX_CONCURRENT_TASKS); 0 means no limit.

    Enforced in the database (access.limits), so they hold across every web process.
    """

    tenant = models.OneToOneField(Tenant, on_delete=models.CASCADE, related_name="limits")
    calls_per_minute = models.PositiveIntegerField(
        null=True, blank=True, help_text="Tool calls per minute for the whole tenant (a minute's worth may come "
        "at once). Empty: the default setting; 0: no limit.")
    calls_per_minute_per_token = models.PositiveIntegerField(
        null=True, blank=True, help_text="Tool calls per minute for each of its API tokens. Empty: the default "
        "setting; 0: no limit.")
    concurrent_tasks_per_agent = models.PositiveIntegerField(
        null=True, blank=True, help_text="Long tasks one agent (one token's identity) may have unfinished at once. "
        "Empty: the default setting; 0: no limit.")

    class Meta:
        verbose_name_plural = "tenant limits"
        # Not Django's change_: no role holds a generic add/change/delete permission (roles.py).
        permissions = [("set_tenant_limits", "Can set a tenant's limits")]

    def __str__(self) -> str:
        return f"limits of {self.tenant}"


class RateBucket(models.Model):
    """A token bucket of one limited scope (a tenant's calls, a token's calls), shared by every
    process: refilled and drawn from by one statement (access.limits)."""

    scope = models.CharField(max_length=64, primary_key=True)
    tokens = models.FloatField()
    refilled_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.scope}: {self.tokens:.1f}"
