"""SQL the ORM cannot say: INSERT ... ON CONFLICT DO NOTHING RETURNING, inside a CTE.

Column lists are derived from the models (and cached: they only change with
the code), so adding a field to a model needs no change here.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from django.db import connection, models


@cache
def _columns(model: type[models.Model]) -> tuple[tuple[models.Field, ...], tuple[str, ...]]:
    fields = tuple(f for f in model._meta.concrete_fields if not f.primary_key)
    return fields, tuple(connection.ops.quote_name(f.column) for f in fields)


def table(model: type[models.Model]) -> str:
    return connection.ops.quote_name(model._meta.db_table)


def insert_parts(
    instance: models.Model, *, expressions: dict[str, str] | None = None
) -> tuple[list[str], list[str], list[Any]]:
    """Columns, value SQL and params for INSERTing `instance`.

    `expressions` replaces the value of some fields with raw SQL (e.g. a
    column of a preceding CTE); those fields take no parameter.
    """
    expressions = expressions or {}
    fields, columns = _columns(type(instance))
    values, params = [], []
    for field in fields:
        if field.attname in expressions:
            values.append(expressions[field.attname])
        else:
            values.append("%s")
            params.append(field.get_db_prep_save(getattr(instance, field.attname), connection))
    return list(columns), values, params


@cache
def select_columns(model: type[models.Model], alias: str = "") -> tuple[tuple[str, ...], str]:
    """Attribute names and the SQL column list to load `model` rows with `from_row`."""
    prefix = f"{alias}." if alias else ""
    fields = model._meta.concrete_fields
    return tuple(f.attname for f in fields), ", ".join(prefix + connection.ops.quote_name(f.column) for f in fields)


@cache
def _converters(model: type[models.Model]) -> tuple[tuple, ...]:
    return tuple(tuple(f.get_db_converters(connection)) for f in model._meta.concrete_fields)


def from_row(model: type[models.Model], row: tuple) -> models.Model:
    """Build an instance from a row selected with `select_columns`, converting values as the ORM would."""
    attnames, _ = select_columns(model)
    values = []
    for value, converters in zip(row, _converters(model), strict=True):
        for converter in converters:
            value = converter(value, None, connection)
        values.append(value)
    return model.from_db(connection.alias, attnames, values)
