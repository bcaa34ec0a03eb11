"""SQL the ORM cannot say: INSERT ... ON CONFLICT DO NOTHING RETURNING, inside a CTE, and the one
guarded state change with its audit event (`transition`).

Column lists are derived from the models (and cached: they only change with
the code), so adding a field to a model needs no change here.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

from django.db import connection, models

from tools_app.core import audit


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
def select_columns(model: type[models.Model], alias: str = "", fields: tuple[str, ...] | None = None
                   ) -> tuple[tuple[str, ...], str]:
    """Attribute names and the SQL column list to load `model` rows with `from_row` (all fields, or
    the attribute names in `fields`: the others are deferred, loaded by Django if ever read)."""
    prefix = f"{alias}." if alias else ""
    chosen = [f for f in model._meta.concrete_fields if fields is None or f.attname in fields]
    return tuple(f.attname for f in chosen), ", ".join(prefix + connection.ops.quote_name(f.column) for f in chosen)


@cache
def _converters(model: type[models.Model], fields: tuple[str, ...] | None = None) -> tuple[tuple, ...]:
    return tuple(tuple(f.get_db_converters(connection)) for f in model._meta.concrete_fields
                 if fields is None or f.attname in fields)


def from_row(model: type[models.Model], row: tuple, fields: tuple[str, ...] | None = None) -> models.Model:
    """Build an instance from a row selected with `select_columns` (with the same `fields`), converting
    values as the ORM would."""
    attnames, _ = select_columns(model, fields=fields)
    values = []
    for value, converters in zip(row, _converters(model, fields), strict=True):
        for converter in converters:
            value = converter(value, None, connection)
        values.append(value)
    return model.from_db(connection.alias, attnames, values)


_COMPARISONS = {"": "= %s", "lt": "< %s", "lte": "<= %s", "gt": "> %s", "gte": ">= %s", "in": "= ANY(%s)"}


def transition(obj: models.Model, expected: dict[str, Any], changes: dict[str, Any], *, action: str, actor: str,
               reason: str = "", trace_id: str | None = None, before: dict[str, Any] | None = None,
               after: dict[str, Any] | None = None, append: dict[str, list] | None = None) -> bool:
    """Move `obj`'s row from the state `expected` to `changes`, and write the audit event of the move.

    One statement: a conditional UPDATE of the row where it still matches
    `expected`, and the INSERT of the event (`action` by `actor`, `before`
    and `after` as given, the object's trace id unless told otherwise) only
    if the UPDATE matched. So the change and its audit row commit together
    or not at all, even outside a transaction, and of two racing callers
    exactly one moves the row. Returns whether it matched; if it did,
    `changes` (and `append`) are applied to `obj` as well.

    `expected` takes field names with an optional `__lt`, `__lte`, `__gt`,
    `__gte`, `__in` or `__isnull` (a plain None means IS NULL); `append`
    adds items to JSON list fields.
    """
    event = audit.new_event(action=action, obj=obj, actor=actor, reason=reason,
                            trace_id=getattr(obj, "trace_id", "") if trace_id is None else trace_id,
                            before=before, after=after)
    if not _conditional_update(obj, expected, changes, event, append or {}):
        return False
    for name, value in changes.items():
        setattr(obj, name, value)
    for name, items in (append or {}).items():
        setattr(obj, name, [*getattr(obj, name), *items])
    return True


def _conditional_update(instance: models.Model, expected: dict[str, Any], changes: dict[str, Any],
                        event: models.Model, append: dict[str, list]) -> bool:
    model = type(instance)
    sets, params = [], []
    for name, value in changes.items():
        field = model._meta.get_field(name)
        sets.append(f"{connection.ops.quote_name(field.column)} = %s")
        params.append(field.get_db_prep_save(value, connection))
    for name, items in append.items():
        column = connection.ops.quote_name(model._meta.get_field(name).column)
        sets.append(f"{column} = {column} || %s::jsonb")
        params.append(json.dumps(items, default=str))
    conditions, condition_params = ["id = %s"], [instance.pk]
    for key, value in expected.items():
        name, _, lookup = key.partition("__")
        column = connection.ops.quote_name(model._meta.get_field(name).column)
        if lookup == "" and value is None:  # `= NULL` would match nothing
            lookup, value = "isnull", True
        if lookup == "isnull":
            conditions.append(f"{column} IS {'' if value else 'NOT '}NULL")
        else:
            conditions.append(f"{column} {_COMPARISONS[lookup]}")
            condition_params.append(list(value) if lookup == "in" else value)
    columns, values, event_params = insert_parts(event)
    sql = (f"WITH changed AS (UPDATE {table(model)} SET {', '.join(sets)} "
           f"WHERE {' AND '.join(conditions)} RETURNING id), "
           f"audited AS (INSERT INTO {table(type(event))} ({', '.join(columns)}) "
           f"SELECT {', '.join(values)} FROM changed) "
           "SELECT count(*) FROM changed")
    with connection.cursor() as cursor:
        cursor.execute(sql, [*params, *condition_params, *event_params])
        return cursor.fetchone()[0] == 1
