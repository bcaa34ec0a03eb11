"""SQL the ORM cannot say: INSERT ... ON CONFLICT DO NOTHING RETURNING, inside a CTE, and the one
guarded state change with its audit event (`transition`).

Column lists are derived from the models (and cached: they only change with
the code), so adding a field to a model needs no change here.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import cache
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connection, connections, models

from tools_app.core import audit


@cache
def _columns(model: type[models.Model]) -> tuple[tuple[models.Field, ...], tuple[str, ...], tuple[bool, ...]]:
    """Fields, quoted columns, and whether each value needs Django's preparation
    (JSON does; psycopg adapts strings, numbers, times and UUIDs itself)."""
    fields = tuple(f for f in model._meta.concrete_fields if not f.primary_key)
    return (fields, tuple(connection.ops.quote_name(f.column) for f in fields),
            tuple(isinstance(f, models.JSONField) for f in fields))


def fetchone(sql: str, params: Sequence[Any]) -> tuple | None:
    """Run one statement and return its first row, on the psycopg connection under Django's.

    For the engine's hot path: the same connection, transaction and error classes as
    `connection.cursor()` (a broken connection is health-checked and replaced the same way), without
    the ORM cursor wrapper's work per statement. psycopg prepares a statement it sees repeatedly
    (DATABASES OPTIONS prepare_threshold).
    """
    # One lookup of this thread's connection: every attribute of the `connection` proxy is another.
    wrapper = connections[DEFAULT_DB_ALIAS]
    wrapper.close_if_health_check_failed()
    wrapper.ensure_connection()
    with wrapper.wrap_database_errors:
        return wrapper.connection.execute(sql, params).fetchone()


def table(model: type[models.Model]) -> str:
    return connection.ops.quote_name(model._meta.db_table)


def insert_parts(
    instance: models.Model, *, expressions: dict[str, str] | None = None
) -> tuple[list[str], list[str], list[Any]]:
    """Columns, value SQL and params for INSERTing `instance`.

    `expressions` replaces the value of some fields with raw SQL (e.g. a
    column of a preceding CTE); those fields take no parameter.
    """
    columns, values = insert_sql(type(instance), expressions)
    return list(columns), list(values), insert_params(instance, expressions)


def insert_sql(model: type[models.Model], expressions: dict[str, str] | None = None
               ) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The columns and value SQL of `insert_parts` (the same for every instance of `model`)."""
    return _insert_sql(model, tuple((expressions or {}).items()))


@cache
def _insert_sql(model: type[models.Model], expressions: tuple[tuple[str, str], ...]) -> tuple[tuple[str, ...],
                                                                                            tuple[str, ...]]:
    given = dict(expressions)
    fields, columns, _ = _columns(model)
    return columns, tuple(given.get(field.attname, "%s") for field in fields)


def insert_params(instance: models.Model, expressions: dict[str, str] | None = None) -> list[Any]:
    """The params of `insert_parts(instance, expressions=...)` alone (its SQL is the same every time)."""
    fields, _, needs_prep = _columns(type(instance))
    params = []
    for field, prep in zip(fields, needs_prep, strict=True):
        if expressions and field.attname in expressions:
            continue
        value = getattr(instance, field.attname)
        params.append(field.get_db_prep_save(value, connection) if prep else value)
    return params


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
    return model.from_db(DEFAULT_DB_ALIAS, attnames, values)


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
    adds items to JSON list fields. `notify` names a channel that hears the
    row's id (pg_notify) in the same statement: PostgreSQL delivers it when
    the change commits, never for one that rolls back.
    """
    event = audit.new_event(action=action, obj=obj, actor=actor, reason=reason,
                            trace_id=getattr(obj, "trace_id", "") if trace_id is None else trace_id,
                            before=before, after=after)
    if not _conditional_update(obj, expected, changes, event, append or {}, notify):
        return False
    audit.announce(event)
    for name, value in changes.items():
        setattr(obj, name, value)
    for name, items in (append or {}).items():
        setattr(obj, name, [*getattr(obj, name), *items])
    return True


def _conditional_update(instance: models.Model, expected: dict[str, Any], changes: dict[str, Any],
                        event: models.Model, append: dict[str, list], notify: str | None = None) -> bool:
    model = type(instance)
    # What the SQL itself says: IS NULL / IS NOT NULL (`__isnull`, or a plain None), not a parameter.
    shape = tuple((key, bool(value) if key.endswith("__isnull") else value is None) for key, value in expected.items())
    sql, change_fields = _update_sql(model, tuple(changes), shape, tuple(append), type(event), bool(notify))
    params = [field.get_db_prep_save(value, connection) for field, value in zip(change_fields, changes.values(),
                                                                                strict=True)]
    params += [json.dumps(items, default=str) for items in append.values()]
    params.append(instance.pk)
    for key, value in expected.items():
        lookup = key.partition("__")[2]
        if lookup == "isnull" or (lookup == "" and value is None):
            continue  # written into the SQL
        params.append(list(value) if lookup == "in" else value)
    params += insert_params(event)
    if notify:
        params.append(notify)
    return fetchone(sql, params)[0] == 1


@cache
def _update_sql(model: type[models.Model], change_names: tuple[str, ...], nulls: tuple[tuple[str, bool], ...],
                append_names: tuple[str, ...], event_model: type[models.Model], notify: bool
                ) -> tuple[str, tuple[models.Field, ...]]:
    """The statement of a transition of this shape (which fields change, which are expected how),
    and the changed fields in parameter order. Built once per shape: the same SQL text each time,
    which psycopg prepares."""
    quote = connection.ops.quote_name
    change_fields = tuple(model._meta.get_field(name) for name in change_names)
    sets = [f"{quote(field.column)} = %s" for field in change_fields]
    for name in append_names:
        column = quote(model._meta.get_field(name).column)
        sets.append(f"{column} = {column} || %s::jsonb")
    conditions = ["id = %s"]
    for key, null in nulls:
        name, _, lookup = key.partition("__")
        column = quote(model._meta.get_field(name).column)
        if lookup == "isnull" or (lookup == "" and null):  # `= NULL` would match nothing
            conditions.append(f"{column} IS {'' if null else 'NOT '}NULL")
        else:
            conditions.append(f"{column} {_COMPARISONS[lookup]}")
    columns, values = insert_sql(event_model)
    sql = (f"WITH changed AS (UPDATE {table(model)} SET {', '.join(sets)} "
           f"WHERE {' AND '.join(conditions)} RETURNING id), "
           f"audited AS (INSERT INTO {table(event_model)} ({', '.join(columns)}) "
           f"SELECT {', '.join(values)} FROM changed)")
    if notify:
        # A SELECT in a WITH runs only if the query reads it: the last line reads it, so the notice goes out.
        sql += (", notified AS (SELECT pg_notify(%s, id::text) FROM changed) "
                "SELECT (SELECT count(*) FROM changed), (SELECT count(*) FROM notified)")
    else:
        sql += " SELECT count(*) FROM changed"
    return sql, change_fields
