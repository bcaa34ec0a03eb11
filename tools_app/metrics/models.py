from django.db import models

from tools_app.toolkit.calls import CallOutcome


class CallEvent(models.Model):
    """One MCP tool call, for the dashboard's rates. Written in batches.

    Not an audit record: replays and conflicts change no state, so they are
    counted here off the request path instead of costing a write each.
    """

    tenant_id = models.BigIntegerField(null=True)
    tool = models.CharField(max_length=100)
    outcome = models.CharField(max_length=16, choices=CallOutcome.choices)
    error_class = models.CharField(max_length=32, blank=True)
    latency_ms = models.FloatField()
    created_at = models.DateTimeField(db_index=True)

    class Meta:
        indexes = [models.Index(fields=["tool", "created_at"], name="callevent_tool_created")]


class Dashboard(CallEvent):
    """The operators' dashboard page in the admin (tools_app.admin.dashboard); its view permission gates it."""

    class Meta:
        proxy = True
        verbose_name = "dashboard"
        verbose_name_plural = "dashboard"
