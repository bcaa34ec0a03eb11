"""Auditor keys in the admin: issue (the key is shown once), grant tenants, revoke.

Every change goes through tools_app.access.auditors, so it is audited; the admin
never writes an AuditorKey row itself.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from tools_app.access import auditors
from tools_app.access.models import AuditorKey
from tools_app.admin.generic import ModelAdmin
from tools_app.core import audit


def _actor(request: HttpRequest) -> str:
    return audit.user_actor(request.user)


@admin.register(AuditorKey)
class AuditorKeyAdmin(ModelAdmin[AuditorKey]):
    list_display = ["name", "prefix", "granted_tenants", "created_at", "last_used_at", "revoked_at"]
    list_filter = ["tenants", ("revoked_at", admin.EmptyFieldListFilter)]
    search_fields = ["name", "prefix"]
    filter_horizontal = ["tenants"]
    readonly_fields = ["prefix", "created_at", "created_by", "last_used_at", "revoked_at"]
    actions = ["revoke_selected"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[AuditorKey]:
        return super().get_queryset(request).prefetch_related("tenants")

    def get_fields(self, request: HttpRequest, obj: AuditorKey | None = None) -> tuple[str, ...]:
        if obj is None:
            return ("name", "tenants")
        return ("name", "tenants", *self.readonly_fields)

    def get_readonly_fields(self, request: HttpRequest, obj: AuditorKey | None = None) -> list[str]:
        if obj is None:
            return []
        return ["name", *self.readonly_fields]

    @admin.display(description="tenants")
    def granted_tenants(self, key: AuditorKey) -> str:
        return ", ".join(t.slug for t in key.tenants.all()) or "—"

    def save_model(self, request: HttpRequest, obj: AuditorKey, form: Any, change: bool) -> None:
        if not change:
            key, raw = auditors.issue_key(form.cleaned_data["name"], list(form.cleaned_data["tenants"]),
                                          actor=_actor(request))
            # The raw key rides on the object to response_add, the one page that shows it (no model field).
            obj.pk, obj.prefix, obj.raw_key = key.pk, key.prefix, raw  # type: ignore[attr-defined]

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        if change:
            auditors.set_tenants(form.instance, list(form.cleaned_data["tenants"]), actor=_actor(request))

    def response_add(self, request: HttpRequest, obj: AuditorKey, post_url_continue: str | None = None) -> HttpResponse:
        # The raw key exists only in this response: it is not stored, logged or put in a message cookie.
        raw_key: str = obj.raw_key  # type: ignore[attr-defined]  # save_model put it there: no model field
        return TemplateResponse(request, "admin/tools_app/auditorkey/issued.html", {
            **self.admin_site.each_context(request), "opts": self.opts, "key": obj, "raw_key": raw_key,
            "title": f"Auditor key {obj.name} issued",
        })

    def has_delete_permission(self, request: HttpRequest, obj: AuditorKey | None = None) -> bool:
        return False  # revoke instead: the row stays as the record of who held access

    @admin.action(description="Revoke selected auditor keys", permissions=["change"])
    def revoke_selected(self, request: HttpRequest, queryset: QuerySet[AuditorKey]) -> None:
        revoked = sum(auditors.revoke_key(key, actor=_actor(request), reason="revoked in the admin")
                      for key in queryset)
        self.message_user(request, f"{revoked} key(s) revoked.", messages.SUCCESS)
