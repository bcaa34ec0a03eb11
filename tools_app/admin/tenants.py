"""Tenants, their API tokens and who may see them. Changes go through tools_app.access and
tools_app.access.roles, which audit them: tokens are issued by `manage.py create_tenant / issue_token`
(shown once), access by `manage.py grant_role`, webhook signing secrets by this page's action
(shown once)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.core.exceptions import ObjectDoesNotExist
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse

from tools_app import access
from tools_app.access.models import ApiToken, Tenant, TenantAccess
from tools_app.admin.generic import ModelAdmin
from tools_app.admin.scoping import ReadOnlyAdmin
from tools_app.core import audit
from tools_app.core.errors import PermissionDenied


@admin.register(Tenant)
class TenantAdmin(ModelAdmin[Tenant]):
    list_display = ["slug", "name", "created_at", "webhook_secret"]
    search_fields = ["slug", "name"]
    actions = ["rotate_webhook_secret"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Tenant]:
        return access.scope(super().get_queryset(request), request.user, "id")

    @admin.display(description="webhook signing secret")
    def webhook_secret(self, tenant: Tenant) -> str:
        try:
            row = tenant.webhook_secret
        except ObjectDoesNotExist:
            return "—"
        return f"{row.prefix}… (rotated {row.rotated_at:%Y-%m-%d %H:%M})" if row.prefix else "—"

    @admin.action(description="Create or rotate the webhook signing secret (shown once)",
                  permissions=["rotate_webhook_secret"])
    def rotate_webhook_secret(self, request: HttpRequest, queryset: QuerySet[Tenant]) -> TemplateResponse:
        try:
            issued = [(tenant, access.rotate_webhook_secret(tenant, request.user)) for tenant in queryset]
        except PermissionDenied as refused:
            raise DjangoPermissionDenied(refused.message) from None
        # The secrets exist only in this response: not logged, not put in a message cookie.
        return TemplateResponse(request, "admin/tools_app/tenant/webhook_secret.html", {
            **self.admin_site.each_context(request), "opts": self.opts, "issued": issued,
            "title": "Webhook signing secrets"})

    def has_rotate_webhook_secret_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(access.ROTATE_WEBHOOK_SECRET.permission)

    def save_model(self, request: HttpRequest, obj: Tenant, form: Any, change: bool) -> None:
        if change:
            super().save_model(request, obj, form, change)
            return
        created = access.create_tenant(obj.slug, obj.name, actor=audit.user_actor(request.user))
        obj.pk, obj._state.adding = created.pk, False


@admin.register(ApiToken)
class ApiTokenAdmin(ReadOnlyAdmin[ApiToken]):
    # The owner: the person responsible for the agent, who cannot approve what it asks for (four eyes).
    list_display = ["tenant", "name", "owner", "prefix", "created_at", "last_used_at", "revoked_at"]
    list_filter = [("tenant", admin.RelatedOnlyFieldListFilter), ("owner", admin.RelatedOnlyFieldListFilter),
                   ("revoked_at", admin.EmptyFieldListFilter)]
    search_fields = ["name", "owner__username"]
    list_select_related = ["tenant", "owner"]
    actions = ["revoke"]

    @admin.action(description="Revoke the selected tokens", permissions=["revoke"])
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiToken]) -> None:
        actor = audit.user_actor(request.user)
        revoked = sum(access.revoke_token(token, actor=actor, reason="revoked in the admin") for token in queryset)
        self.message_user(request, f"{revoked} token(s) revoked")

    def has_revoke_permission(self, request: HttpRequest) -> bool:
        return request.user.is_superuser


@admin.register(TenantAccess)
class TenantAccessAdmin(ReadOnlyAdmin[TenantAccess]):
    list_display = ["user", "tenant", "granted_at"]
    list_filter = [("tenant", admin.RelatedOnlyFieldListFilter)]
    list_select_related = ["user", "tenant"]
