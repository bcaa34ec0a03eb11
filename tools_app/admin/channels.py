"""Tenants' notification channels (tools_app.outbox.channels): add one by its Apprise URL, which is sealed
on save and never shown again; each row shows how its latest message fared (a failing channel stands out)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.core.exceptions import ValidationError
from django.http import HttpRequest

from tools_app import outbox
from tools_app.admin.generic import ModelAdmin
from tools_app.admin.refusals import RefusalsAuditedAdmin
from tools_app.admin.scoping import TenantScopedAdmin
from tools_app.core import errors
from tools_app.outbox import channels
from tools_app.outbox.models import NotificationChannel, OutboxEvent, OutboxStatus

URL_HELP = ("The channel's Apprise URL, e.g. slack://TokenA/TokenB/TokenC/#channel, msteams://…, "
            "pagerduty://IntegrationKey@ApiKey, json://host/path (see https://github.com/caronc/apprise/wiki). "
            "It holds the channel's secret: it is stored sealed and never shown again; leave it empty to keep it.")


# django-stubs makes ModelForm generic over its model; the admin's forms name it in Meta instead.
class ChannelForm(forms.ModelForm):  # type: ignore[type-arg]
    url = forms.CharField(label="Apprise URL", required=False, help_text=URL_HELP,
                          widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "off"}))

    class Meta:
        model = NotificationChannel
        fields = ["tenant", "name", "url", "escalations_only", "enabled"]

    def clean_url(self) -> str:
        url: str = (self.cleaned_data.get("url") or "").strip()
        if not url and not self.instance.sealed_url:
            raise ValidationError("A new channel needs its Apprise URL.")
        if url:
            try:
                channels.check_url(url)
            except errors.InvalidInput as invalid:
                raise ValidationError(invalid.message) from None
        return url


@admin.register(NotificationChannel)
class NotificationChannelAdmin(RefusalsAuditedAdmin[NotificationChannel], TenantScopedAdmin[NotificationChannel],
                               ModelAdmin[NotificationChannel]):
    refusal_permit = outbox.CHANGE_CHANNEL
    form = ChannelForm
    list_display = ["name", "tenant", "shown", "escalations_only", "enabled", "latest_message"]
    list_filter = ["enabled", "escalations_only"]
    list_select_related = ["tenant"]
    readonly_fields = ["shown", "latest_message"]

    # One permission (manage_notificationchannel) to add and change; the concept function checks it again, with
    # the tenant. No deleting: disable a channel instead (its messages' history keeps naming it).
    def has_add_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(outbox.CHANGE_CHANNEL.permission)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm(outbox.CHANGE_CHANNEL.permission)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="latest message")
    def latest_message(self, obj: NotificationChannel) -> str:
        """How the latest message to this channel fared: delivered, waiting to be retried (and why), or dead."""
        event = (OutboxEvent.objects.filter(tenant_id=obj.tenant_id, kind=outbox.CHANNEL_KIND, payload__channel=obj.pk)
                 .order_by("-created_at").first())
        if event is None:
            return "—"
        if event.status == OutboxStatus.DELIVERED:
            return f"delivered {event.delivered_at:%Y-%m-%d %H:%M}"
        state = "dead-lettered" if event.status == OutboxStatus.DEAD else f"retrying (attempt {event.attempts})"
        return f"{state}: {event.last_error}" if event.last_error else state

    def save_model(self, request: HttpRequest, obj: NotificationChannel, form: Any, change: bool) -> None:
        try:
            outbox.save_channel(obj, request.user, url=form.cleaned_data.get("url") or None)
        except errors.PermissionDenied as refused:  # audited again after the rollback (RefusalsAuditedAdmin)
            raise errors.Refused(refused.message, obj) from None
