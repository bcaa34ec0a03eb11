from django.db import models


class BreakerState(models.TextChoices):
    CLOSED = "closed", "Closed: calls run"
    OPEN = "open", "Open: calls answer transient until the next probe"
    PROBING = "probing", "Probing: one call is testing the downstream"


class Downstream(models.Model):
    """A downstream system tools call, by its declared name (ToolSpec.downstream) or its URL's host:
    its circuit breaker. A row appears with the first failure counted against it."""

    name = models.CharField(max_length=200, unique=True)
    state = models.CharField(max_length=16, choices=BreakerState.choices, default=BreakerState.CLOSED)
    failures = models.PositiveIntegerField(default=0, help_text="Definite failures or timeouts in the current "
                                                                "window (IDEMOPS_BREAKER_WINDOW_SECONDS).")
    window_started_at = models.DateTimeField(null=True, blank=True)
    opened_at = models.DateTimeField(null=True, blank=True)
    next_probe_at = models.DateTimeField(null=True, blank=True, help_text="While open: when one call may test it.")
    probe_until = models.DateTimeField(null=True, blank=True, help_text="While probing: the probe's lease.")
    last_failure = models.TextField(blank=True)
    updated_at = models.DateTimeField()

    class Meta:
        ordering = ["name"]
        verbose_name = "downstream system"
        permissions = [("pause_operations", "Can pause and resume tools, downstream systems and tenants' writes")]

    def __str__(self) -> str:
        return f"{self.name} ({self.state})"


class PauseScope(models.TextChoices):
    TOOL = "tool", "A tool"
    DOWNSTREAM = "downstream", "A downstream system"
    TENANT = "tenant", "One tenant's writes"


class Pause(models.Model):
    """An operator's pause: calls it covers answer transient with its reason until it is resumed
    (the row is deleted then; both are audited)."""

    scope = models.CharField(max_length=16, choices=PauseScope.choices)
    target = models.CharField(max_length=200, help_text="The tool's or downstream's name, or the tenant's slug.")
    # Set for a tenant's pause: who may see it (access.authorize); a tool's or a downstream's pause is
    # the whole platform's.
    tenant = models.ForeignKey("tools_app.Tenant", null=True, blank=True, on_delete=models.CASCADE)
    reason = models.TextField()
    paused_by = models.CharField(max_length=200)
    paused_at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["scope", "target"], name="one_pause_per_target")]
        ordering = ["-paused_at"]

    def __str__(self) -> str:
        return f"{self.scope} {self.target} paused"


class DownstreamSlot(models.Model):
    """One of a downstream's IDEMOPS_DOWNSTREAM_MAX_IN_FLIGHT places for a call in flight, leased by
    the process sending it (a crash frees it when the lease runs out)."""

    downstream = models.CharField(max_length=200)
    slot = models.PositiveIntegerField()
    holder = models.CharField(max_length=100, blank=True)
    held_until = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["downstream", "slot"], name="one_slot_per_number")]
