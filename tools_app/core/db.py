"""SQL the ORM cannot say: INSERT ... ON CONFLICT DO NOTHING RETURNING, inside a CTE.

Column lists are derived from the models (and cached: they only change with
the code), so adding a field to a model needs no change here.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

from django.db import connection, models


@cache
def _columns(model: type[models.Model]) -> tuple[tuple[models.Field, ...], tuple[str, ...], tuple[bool, ...]]:
    """Fields, quoted columns, and whether each value needs Django's preparation
    (JSON does; psycopg adapts strings, numbers, times and UUIDs itself)."""
    fields = tuple(f for f in model._meta.concrete_fields if not f.primary_key)
    return (fields, tuple(connection.ops.quote_name(f.column) for f in fields),
            tuple(isinstance(f, models.JSONField) for f in fields))


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
    fields, columns, needs_prep = _columns(type(instance))
    values, params = [], []
    for field, prep in zip(fields, needs_prep, strict=True):
        if field.attname in expressions:
            values.append(expressions[field.attname])
            continue
        value = getattr(instance, field.attname)
        values.append("%s")
        params.append(field.get_db_prep_save(value, connection) if prep else value)
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


_COMPARISONS = {"": "= %s", "lt": "< %s", "lte": "<= %s", "gt": "> %s", "gte": ">= %s", "in": "= ANY(%s)"}


def conditional_update(instance: models.Model, expected: dict[str, Any], changes: dict[str, Any], *,
                       event: models.Model | None = None, append: dict[str, list] | None = None) -> bool:
    """UPDATE `instance`'s row only if it still matches `expected`; INSERT `event` only if it did.

    One statement, so the state change and its audit event commit together
    or not at all, even outside a transaction. `expected` takes field names
    with an optional `__lt`, `__lte`, `__gt`, `__gte`, `__in` or `__isnull`; `append` adds
    items to JSON list fields. Returns whether the row matched.
    """
    model = type(instance)
    sets, params = [], []
    for name, value in changes.items():
        field = model._meta.get_field(name)
        sets.append(f"{connection.ops.quote_name(field.column)} = %s")
        params.append(field.get_db_prep_save(value, connection))
    for name, items in (append or {}).items():
        column = connection.ops.quote_name(model._meta.get_field(name).column)
        sets.append(f"{column} = {column} || %s::jsonb")
        params.append(json.dumps(items, default=str))
    conditions, condition_params = ["id = %s"], [instance.pk]
    for key, value in expected.items():
        name, _, lookup = key.partition("__")
        column = connection.ops.quote_name(model._meta.get_field(name).column)
        if lookup == "isnull":
            conditions.append(f"{column} IS {'' if value else 'NOT '}NULL")
        else:
            conditions.append(f"{column} {_COMPARISONS[lookup]}")
            condition_params.append(list(value) if lookup == "in" else value)
    sql = f"WITH changed AS (UPDATE {table(model)} SET {', '.join(sets)} WHERE {' AND '.join(conditions)} RETURNING id)"
    event_params: list[Any] = []
    if event is not None:
        columns, values, event_params = insert_parts(event)
        sql += (f", audited AS (INSERT INTO {table(type(event))} ({', '.join(columns)}) "
                f"SELECT {', '.join(values)} FROM changed)")
    with connection.cursor() as cursor:
        cursor.execute(sql + " SELECT count(*) FROM changed", [*params, *condition_params, *event_params])
        return cursor.fetchone()[0] == 1
