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
from django.db.models.sql import Query

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
    column of a preceding CTE); those fields take no parameter. A field whose
    value is an ORM expression (the database's clock: core.clock) is compiled.
    """
    expressions = expressions or {}
    fields, columns, needs_prep = _columns(type(instance))
    values, params = [], []
    for field, prep in zip(fields, needs_prep, strict=True):
        if field.attname in expressions:
            values.append(expressions[field.attname])
            continue
        value = getattr(instance, field.attname)
        if is_expression(value):
            sql, expression_params = compile_expression(type(instance), value)
            values.append(sql)
            params.extend(expression_params)
            continue
        values.append("%s")
        params.append(field.get_db_prep_save(value, connection) if prep else value)
    return list(columns), values, params


def is_expression(value: Any) -> bool:
    return hasattr(value, "resolve_expression")


def compile_expression(model: type[models.Model], expression: Any) -> tuple[str, list[Any]]:
    """SQL and parameters of an ORM expression about one row of `model` (e.g. `clock.later(10)`,
    or `clock.NOW + (F("expires_at") - F("created_at"))` in an UPDATE of that row)."""
    query = Query(model)
    resolved = expression.resolve_expression(query, allow_joins=False, for_save=True)
    sql, params = query.get_compiler(connection=connection).compile(resolved)
    return sql, list(params)


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


def transition(obj: models.Model, expected: dict[str, Any], changes: dict[str, Any], *, action: str, actor: str,
               reason: str = "", trace_id: str | None = None, before: dict[str, Any] | None = None,
               after: dict[str, Any] | None = None, append: dict[str, list] | None = None,
               notify: str | None = None) -> bool:
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
    adds items to JSON list fields. A value of `changes` or `expected` may be
    an ORM expression, e.g. the database's clock (core.clock.NOW, `later`):
    the row's new value is read back from the UPDATE onto `obj`. `notify` names
    a channel that hears the row's id (pg_notify) in the same statement:
    PostgreSQL delivers it when the change commits, never for one that rolls back.
    """
    event = audit.new_event(action=action, obj=obj, actor=actor, reason=reason,
                            trace_id=getattr(obj, "trace_id", "") if trace_id is None else trace_id,
                            before=before, after=after)
    computed = _conditional_update(obj, expected, changes, event, append or {}, notify)
    if computed is None:
        return False
    audit.announce(event)
    for name, value in changes.items():
        setattr(obj, name, computed[name] if name in computed else value)
    for name, items in (append or {}).items():
        setattr(obj, name, [*getattr(obj, name), *items])
    return True


def _conditional_update(instance: models.Model, expected: dict[str, Any], changes: dict[str, Any],
                        event: models.Model, append: dict[str, list],
                        notify: str | None = None) -> dict[str, Any] | None:
    """None if the row did not match; else the values the database computed (expressions), by field."""
    model = type(instance)
    sets, params, computed = [], [], []
    for name, value in changes.items():
        field = model._meta.get_field(name)
        column = connection.ops.quote_name(field.column)
        if is_expression(value):
            sql, expression_params = compile_expression(model, value)
            sets.append(f"{column} = {sql}")
            params.extend(expression_params)
            computed.append(field)
            continue
        sets.append(f"{column} = %s")
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
        elif is_expression(value):
            sql, expression_params = compile_expression(model, value)
            conditions.append(f"{column} {_COMPARISONS[lookup].replace('%s', sql)}")
            condition_params.extend(expression_params)
        else:
            conditions.append(f"{column} {_COMPARISONS[lookup]}")
            condition_params.append(list(value) if lookup == "in" else value)
    columns, values, event_params = insert_parts(event)
    returned = "".join(f", {connection.ops.quote_name(field.column)}" for field in computed)
    sql = (f"WITH changed AS (UPDATE {table(model)} SET {', '.join(sets)} "
           f"WHERE {' AND '.join(conditions)} RETURNING id{returned}), "
           f"audited AS (INSERT INTO {table(type(event))} ({', '.join(columns)}) "
           f"SELECT {', '.join(values)} FROM changed)")
    notify_params = [notify] if notify else []
    if notify:
        # A SELECT in a WITH runs only if the query reads it: the last line reads it, so the notice goes out.
        sql += (", notified AS (SELECT pg_notify(%s, id::text) FROM changed) "
                "SELECT *, (SELECT count(*) FROM notified) FROM changed")
    else:
        sql += " SELECT * FROM changed"
    with connection.cursor() as cursor:
        cursor.execute(sql, [*params, *condition_params, *event_params, *notify_params])
        rows = cursor.fetchall()
    if len(rows) != 1:
        return None
    values = rows[0][1:1 + len(computed)]
    return {field.name: _converted(field, value) for field, value in zip(computed, values, strict=True)}


def _converted(field: models.Field, value: Any) -> Any:
    for converter in field.get_db_converters(connection):
        value = converter(value, None, connection)
    return value
