"""A refused change made through an admin form, audited although the form's transaction rolls back.

Django runs the add, change and delete views in a transaction, which a refusal (an exception) rolls
back, the refusal's audit event included. An admin whose saves call a concept function behind a
Permit mixes this in: `save_model` and friends raise `Refused`, and the view writes the refusal's
event again once that transaction is gone, then answers 403.
"""

from __future__ import annotations

from typing import Any, NoReturn

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.http import HttpRequest, HttpResponse

from tools_app import access
from tools_app.admin.generic import ModelAdmin, ModelT
from tools_app.core import audit
from tools_app.core.errors import Refused


class RefusalsAuditedAdmin(ModelAdmin[ModelT]):
    refusal_permit: access.Permit  # the Permit of the concept function the saves call

    def changeform_view(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        try:
            return super().changeform_view(request, *args, **kwargs)
        except Refused as refused:
            self._refuse(request, refused)

    def delete_view(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        try:
            return super().delete_view(request, *args, **kwargs)
        except Refused as refused:
            self._refuse(request, refused)

    def changelist_view(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        try:
            return super().changelist_view(request, *args, **kwargs)
        except Refused as refused:
            self._refuse(request, refused)

    def _refuse(self, request: HttpRequest, refused: Refused) -> NoReturn:
        # The subject may have been made in the rolled-back transaction: then the event names the model.
        subject = refused.subject if refused.subject is not None and refused.subject.pk is not None and type(
            refused.subject)._default_manager.filter(pk=refused.subject.pk).exists() else self.model
        access.audit_refusal(self.refusal_permit, subject, audit.user_actor(request.user), refused.reason)
        raise DjangoPermissionDenied(refused.reason)
