"""The admin's base classes, generic in their model for the type checker.

django-stubs declares `ModelAdmin` and `TabularInline` generic in the model (`ModelAdmin[Task]`), but
Django's classes cannot be subscripted at run time (django_stubs_ext.monkeypatch would patch them, and
it is a development dependency only). These subclasses can: subscripting one gives the class itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

from django.contrib import admin
from django.db.models import Model

ModelT = TypeVar("ModelT", bound=Model)

if TYPE_CHECKING:
    ModelAdmin = admin.ModelAdmin
    TabularInline = admin.TabularInline
else:
    class ModelAdmin(admin.ModelAdmin):
        def __class_getitem__(cls, model: Any) -> type:
            return cls

    class TabularInline(admin.TabularInline):
        def __class_getitem__(cls, model: Any) -> type:
            return cls
