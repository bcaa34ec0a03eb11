"""Agents by OAuth in the console: each person's connected clients (AgentConnection), which they revoke.
The consent page is `consent.py` (served at /oauth/authorize/, see idemops/urls.py)."""

from __future__ import annotations

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest

from tools_app.access import oauth
from tools_app.access.models import AgentConnection
from tools_app.admin.generic import ModelAdmin
from tools_app.core import audit


@admin.register(AgentConnection)
class AgentConnectionAdmin(ModelAdmin[AgentConnection]):
    """Connected agents (OAuth clients): a person sees and revokes their own; a superuser everyone's."""

    list_display = ["client", "user", "tenant", "scopes", "created_at", "updated_at", "revoked_at"]
    list_select_related = ["application", "user", "tenant"]
    list_filter = ["tenant"]
    actions = ["revoke"]
    readonly_fields = ["application", "user", "tenant", "scopes", "created_at", "updated_at", "revoked_at"]

    @admin.display(description="client")
    def client(self, obj: AgentConnection) -> str:
        return str(obj.application.name or obj.application.client_id)

    def get_queryset(self, request: HttpRequest) -> QuerySet[AgentConnection]:
        rows = super().get_queryset(request)
        return rows if request.user.is_superuser else rows.filter(user__username=request.user.get_username())

    def has_view_permission(self, request: HttpRequest, obj: AgentConnection | None = None) -> bool:
        return bool(request.user.is_active and request.user.is_staff)

    def has_module_permission(self, request: HttpRequest) -> bool:
        return self.has_view_permission(request)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # made by consenting, on the consent page

    def has_change_permission(self, request: HttpRequest, obj: AgentConnection | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: AgentConnection | None = None) -> bool:
        return False  # revoked (kept, with its audit trail), never deleted

    @admin.action(description="Revoke: the client's tokens stop working")
    def revoke(self, request: HttpRequest, queryset: QuerySet[AgentConnection]) -> None:
        for connection in queryset:
            if not oauth.may_revoke(request.user, connection):
                raise DjangoPermissionDenied("you may revoke only your own connections")
            done = oauth.revoke(connection, actor=audit.user_actor(request.user), reason="revoked in the console")
            self.message_user(request, f"{connection.application.name or connection.application.client_id}: "
                              f"{'revoked' if done else 'was revoked already'}", messages.SUCCESS)
