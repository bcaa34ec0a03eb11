"""Model instances built as Django builds them, without `Model.__init__`'s walk of every field.

The engine builds a few instances on every call: the record and audit events it inserts, the record a
replay reads. `Model.__init__` walks every concrete field through descriptors and keyword lookups
(7 µs for an audit event, 9 µs for a record read with its replay's fields); the same instance is a
`__dict__` filled in one pass. Only for a model that adds nothing to Django's construction: no
`__init__` or `from_db` of its own and no `pre_init`/`post_init` listener (checked on each build, so
a listener connected later is still called); any other model is built by Django itself.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import cache
from typing import Any, TypeVar

from django.db import models
from django.db.models.base import ModelState
from django.db.models.signals import post_init, pre_init

_M = TypeVar("_M", bound=models.Model)

_FROM_DB = vars(models.Model)["from_db"].__func__


def _plain(model: type[models.Model]) -> bool:
    """Whether Django's construction of `model` is only filling its fields. (A signal with no receivers
    at all, as is usual for these two, is not asked about this model: that asks its cache, a weak
    dictionary, each time.)"""
    return (model.__init__ is models.Model.__init__ and getattr(model.from_db, "__func__", None) is _FROM_DB
            and not (pre_init.receivers and pre_init.has_listeners(model))
            and not (post_init.receivers and post_init.has_listeners(model)))


def _bare(model: type[_M], *, adding: bool, db: str | None) -> _M:
    instance = model.__new__(model)
    state = instance._state = ModelState()
    state.adding, state.db = adding, db
    return instance


def loaded(model: type[_M], db: str, attnames: Sequence[str], values: Sequence[Any]) -> _M:
    """`model.from_db(db, attnames, values)`: an instance read from the database, its fields not in
    `attnames` deferred (absent from its `__dict__`, loaded by Django if ever read)."""
    if not _plain(model):
        return model.from_db(db, attnames, values)
    instance = _bare(model, adding=False, db=db)
    instance.__dict__.update(zip(attnames, values, strict=True))
    return instance


def unsaved(model: type[_M], related: Mapping[str, models.Model | None] | None = None, **values: Any) -> _M:
    """`model(**related, **values)`, for values named by their fields' attribute names (`tenant_id`, not
    `tenant`) and `related` objects by their foreign keys' names (`task`: its id is the value of
    `task_id`, and the object is what `instance.task` answers, as Django's constructor keeps it): every
    other concrete field takes its default, as Django's constructor gives it."""
    ids = {_fk_attname(model, name): None if obj is None else obj.pk for name, obj in (related or {}).items()}
    if not _plain(model) or not values.keys() <= _attnames(model):
        return model(**values, **(related or {}))
    values.update(ids)
    instance = _bare(model, adding=True, db=None)
    fields = instance.__dict__
    for attname, constant, make in _defaults(model):
        if attname in values:
            fields[attname] = values[attname]
        else:
            fields[attname] = constant if make is None else make()
    if related:
        instance._state.fields_cache.update(related)
    return instance


@cache
def _fk_attname(model: type[models.Model], name: str) -> str:
    field = model._meta.get_field(name)
    assert isinstance(field, models.ForeignKey), f"{model.__name__}.{name} is not a foreign key"
    return field.attname


@cache
def _defaults(model: type[models.Model]) -> tuple[tuple[str, Any, Callable[[], Any] | None], ...]:
    """Each field's attribute name and its default: a value Django's `get_default` gives as it is every
    time (a constant `default`, or none: None or ""), or the function that makes a new one (a callable
    `default`, or a `db_default`'s expression, which Django builds anew for each instance)."""
    # Django's constructor skips generated fields: the database computes them.
    return tuple((field.attname, *_default(field)) for field in model._meta.concrete_fields if not field.generated)


def _default(field: models.Field[Any, Any]) -> tuple[Any, Callable[[], Any] | None]:
    if field.has_default():
        return (None, field.default) if callable(field.default) else (field.get_default(), None)
    if field.has_db_default():
        return None, field.get_default
    return field.get_default(), None


@cache
def _attnames(model: type[models.Model]) -> frozenset[str]:
    return frozenset(attname for attname, _, _ in _defaults(model))
