"""SQL the ORM cannot say: INSERT ... ON CONFLICT DO NOTHING RETURNING, inside a CTE, and the one
guarded state change with its audit event (`transition`).

Column lists are derived from the models (and cached: they only change with
the code), so adding a field to a model needs no change here.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar, cast

import psycopg
from django.db import DEFAULT_DB_ALIAS, connection, connections, models
from django.db.models.sql import Query
from psycopg.types.datetime import TimestamptzLoader
from psycopg.types.json import Jsonb

from tools_app.core import audit, instances, jsontext, personal

if TYPE_CHECKING:
    from tools_app.core.models import AuditEvent

_M = TypeVar("_M", bound=models.Model)


@cache
def _columns(model: type[models.Model]) -> tuple[tuple[models.Field[Any, Any], ...], tuple[str, ...], tuple[bool, ...]]:
    """Fields, quoted columns, and whether each value needs Django's preparation
    (JSON does; psycopg adapts strings, numbers, times and UUIDs itself)."""
    fields = tuple(f for f in model._meta.concrete_fields if not f.primary_key)
    return (fields, tuple(connection.ops.quote_name(_column(f)) for f in fields),
            tuple(isinstance(f, models.JSONField) for f in fields))


def fetchone(sql: str, params: Sequence[Any]) -> tuple[Any, ...] | None:
    """Run one statement and return its first row, on the psycopg connection under Django's.

    For the engine's hot path: the same connection, transaction and error classes as
    `connection.cursor()` (a broken connection is health-checked and replaced the same way), without
    the ORM cursor wrapper's work per statement. The statement's `%s` placeholders are numbered
    once per text (`_numbered`) and it runs on a `psycopg.RawCursor`, which sends it as it is:
    psycopg would parse the placeholders again on every call of a statement longer than 4,096
    characters or with more than 50 of them (the claim). psycopg prepares a statement it sees
    repeatedly (DATABASES OPTIONS prepare_threshold). With server-side binding off
    (IDEMOPS_DB_SERVER_SIDE_BINDING, a pooler's choice) it runs as psycopg's own cursor would.
    The cursor is kept for the connection's next statements (`_kept_cursor`).
    """
    # One lookup of this thread's connection: every attribute of the `connection` proxy is another.
    wrapper = connections[DEFAULT_DB_ALIAS]
    wrapper.close_if_health_check_failed()
    wrapper.ensure_connection()
    with wrapper.wrap_database_errors:
        numbered = _numbered(sql) if wrapper.settings_dict["OPTIONS"].get("server_side_binding") else None
        cursor = _kept_cursor(wrapper, numbered or sql, raw_text=numbered is not None)
        # The raw psycopg connection is untyped in django-stubs (`Any`); its rows are tuples.
        row = cast("tuple[Any, ...] | None", cursor.execute(numbered or sql, params).fetchone())
        _let_go(cursor)
        return row


def _let_go(cursor: Any) -> None:
    """Free what a kept cursor still holds of its statement once its row is read: the result (a replay's can
    hold a large tool result) and the parameters sent. Without this each of a connection's kept cursors would
    hold its statement's last result until that statement ran again. (psycopg has no public call for it:
    `close` also ends the cursor. Its adapters, what the cursor is kept for, stay.)"""
    cursor._reset()
    cursor._tx.set_pgresult(None)


def _kept_cursor(wrapper: Any, sql: str, *, raw_text: bool) -> Any:
    """A cursor on this thread's psycopg connection for the statement `sql` (a `RawCursor` for a numbered
    text), kept on that connection for the statement's next runs as long as it lives. (On the psycopg
    connection, not on Django's wrapper: a pool hands each request one of its connections, which one a
    thread gets changing from request to request.)

    One cursor per statement text, not one for all: psycopg keeps a cursor's adapters (the dumper found for
    each parameter's type, the loader for each column's) only while the cursor runs the same text object
    again, and starts afresh when it runs another. A first call alternates its claim and its mark, so one
    cursor for both found every dumper again on every statement: about 15 µs for the claim's 52 parameters
    and 12 µs for the mark's 23 (a `TextChoices` status is looked up through its class's MRO). The texts come
    from caches (`_numbered`, the statements' builders), so the same statement is the same object; at most
    `KEPT_CURSORS` are kept, the least recently used closed first. A new cursor costs about 20 µs.

    Its times are read by psycopg's own loader (C, from psycopg-binary) instead of Django's, a Python
    subclass that converts each value again (`register_tzloader`): a replay's three times cost it
    about 20 µs of its 150 µs of Python. Only where the two give the same value: Django wants UTC
    (USE_TZ, no DATABASES TIME_ZONE) and the session's time zone is UTC, which psycopg reads as
    `datetime.timezone.utc`, the object Django attaches. Otherwise (a session's `SET TIME ZONE`, another
    zone configured) the statement gets a new cursor that reads times as Django's cursors do."""
    raw = wrapper.connection
    if wrapper.timezone is not dt.UTC or raw.pgconn.parameter_status(b"TimeZone") != b"UTC":
        return psycopg.RawCursor(raw) if raw_text else raw.cursor()
    kept: dict[str, Any] | None = raw.__dict__.get("_idemops_cursors")
    if kept is None:
        kept = raw._idemops_cursors = {}
    cursor = kept.pop(sql, None)  # put back last: the most recently used
    if cursor is None:
        if len(kept) >= KEPT_CURSORS:
            kept.pop(next(iter(kept))).close()
        cursor = psycopg.RawCursor(raw) if raw_text else raw.cursor()
        cursor.adapters.register_loader(_TIMESTAMPTZ, TimestamptzLoader)
    kept[sql] = cursor
    return cursor


# Statements a connection keeps a cursor for: the engine's hot ones (a claim, a replay's read, a mark, a task
# step's) are a handful per shape.
KEPT_CURSORS = 32


_TIMESTAMPTZ = psycopg.postgres.types["timestamptz"].oid


@lru_cache(maxsize=1024)
def _numbered(sql: str) -> str | None:
    """`sql` with its `%s` placeholders numbered `$1`, `$2`, … (and `%%` a plain `%`), as a RawCursor
    takes it; None for a statement with other placeholders (`%(name)s`), left to psycopg."""
    parts = _PLACEHOLDERS.split(sql)
    if any("%" in text for text in parts[::2]):
        return None
    numbered, count = [], 0
    for index, part in enumerate(parts):
        if index % 2 == 0:
            numbered.append(part)
        elif part == "%%":
            numbered.append("%")
        else:
            count += 1
            numbered.append(f"${count}")
    return "".join(numbered)


_PLACEHOLDERS = re.compile(r"(%%|%s)")


def table(model: type[models.Model]) -> str:
    return connection.ops.quote_name(model._meta.db_table)


class InsertParts(NamedTuple):
    """What an INSERT of one instance needs (`insert_parts`)."""

    columns: tuple[str, ...]
    values: tuple[str, ...]  # each column's value SQL: `%s`, or an expression's
    params: list[Any]
    computed: tuple[models.Field[Any, Any], ...]  # the fields whose value the database computes


def insert_parts(instance: models.Model, expressions: dict[str, str] | None = None) -> InsertParts:
    """Columns, value SQL and params for INSERTing `instance`, in one walk of its fields.

    `expressions` replaces the value of some fields with raw SQL (e.g. a
    column of a preceding CTE); those fields take no parameter. A field whose
    value is an ORM expression (the database's clock: core.clock) is compiled, and its value
    is the database's (`computed`, for a RETURNING). The columns and value SQL are the same for
    every instance of a model whose fields hold expressions of the same shape: built once per shape.
    """
    model = type(instance)
    given = expressions or {}
    wrapper = _wrapper()  # what a JSON field's preparation reads
    params: list[Any] = []
    shape: list[tuple[str, str]] = []
    held = instance.__dict__
    for field, attname, how in _insert_plan(model):
        if given and attname in given:
            continue
        value = held[attname] if attname in held else getattr(instance, attname)
        if is_expression(value):
            sql, expression_params = expression_sql(model, value)
            shape.append((attname, sql))
            params.extend(expression_params)
        else:
            params.append(value if how is _AS_IS else _param(field, how, value, wrapper))
    columns, values, computed = _insert_sql(model, tuple(given.items()), tuple(shape))
    return InsertParts(columns, values, params, computed)


# How a field's value becomes a statement's parameter (`_param`).
_AS_IS, _JSON, _PREPARED = "as is", "json", "prepared"
_JSON_TYPES = frozenset({dict, list, str, int, float, bool, type(None)})


def _param(field: models.Field[Any, Any], how: str, value: Any, wrapper: Any) -> Any:
    """`value` of `field` as a parameter (a field an INSERT writes `_AS_IS` is not asked: psycopg adapts
    strings, numbers, times and UUIDs itself). For Django's own JSONField without an encoder (`_JSON`), as
    Django prepares it, Jsonb(value) (None: SQL NULL), without its five calls; otherwise by the field's
    `get_db_prep_save` (`_PREPARED`: another JSON field's own preparation, or any field's in an UPDATE), on
    `wrapper`, this thread's connection wrapper (`_wrapper`). Django's JSON text is written by the encoder built
    once (`_json_text`)."""
    if how is _JSON and type(value) in _JSON_TYPES:
        return None if value is None else Jsonb(value, _JSON_TEXT)
    return _json_text(field.get_db_prep_save(value, wrapper))


def _how(field: models.Field[Any, Any]) -> str:
    """How an UPDATE sets `field` (`_param`)."""
    return _JSON if type(field) is models.JSONField and field.encoder is None else _PREPARED


@cache
def _insert_plan(model: type[models.Model]) -> tuple[tuple[models.Field[Any, Any], str, str], ...]:
    """Each field an INSERT writes, its attribute name, and how its value becomes a parameter (`_param`):
    a JSON field as an UPDATE sets it, any other as it is."""
    fields, _, needs_prep = _columns(model)
    return tuple((field, field.attname, _how(field) if prep else _AS_IS)
                 for field, prep in zip(fields, needs_prep, strict=True))


@cache
def _update_plan(model: type[models.Model], name: str) -> tuple[models.Field[Any, Any], str]:
    """The field an UPDATE sets by `name`, and how its value becomes a parameter (`_param`)."""
    field = _field(model, name)
    return field, _how(field)


def _json_text(param: Any) -> Any:
    """A field's prepared value, Django's JSON parameter (psycopg's `Jsonb`, written by `json.dumps`) written
    instead by an encoder built once (core.jsontext: the same text, about 2 µs a value less)."""
    if type(param) is Jsonb and param.dumps is json.dumps:
        param.dumps = _JSON_TEXT
    return param


_JSON_TEXT = jsontext.encoder()


@cache
def _insert_sql(model: type[models.Model], expressions: tuple[tuple[str, str], ...],
                computed: tuple[tuple[str, str], ...],
                ) -> tuple[tuple[str, ...], tuple[str, ...], tuple[models.Field[Any, Any], ...]]:
    given = dict(expressions) | dict(computed)
    fields, columns, _ = _columns(model)
    names = dict(computed)
    return (columns, tuple(given.get(field.attname, "%s") for field in fields),
            tuple(field for field in fields if field.attname in names))


def _field(model: type[models.Model], name: str) -> models.Field[Any, Any]:
    """The concrete field `name` of `model` (the stubs' `get_field` also admits reverse relations,
    which no transition names)."""
    field = model._meta.get_field(name)
    assert isinstance(field, models.Field), f"{model.__name__}.{name} is not a concrete field"
    return field


def _column(field: models.Field[Any, Any]) -> str:
    """A concrete field's column (the stubs type it optional: only non-concrete fields lack one)."""
    assert field.column is not None, f"{field} has no column"
    return field.column


def is_expression(value: Any) -> bool:
    """Whether `value` is an ORM expression (the database's clock) rather than a value: a value of the
    types fields mostly hold is answered without looking for the attribute (asked for every field of
    every row the engine inserts)."""
    return type(value) not in _VALUE_TYPES and hasattr(value, "resolve_expression")


_VALUE_TYPES = frozenset({str, int, bool, float, type(None), dict, list, uuid.UUID, dt.datetime, dt.date})


def expression_sql(model: type[models.Model], expression: Any) -> tuple[str, tuple[Any, ...]]:
    """SQL and parameters of an ORM expression about one row of `model` (e.g. `clock.later(10)`,
    or `clock.NOW + (F("expires_at") - F("created_at"))` in an UPDATE of that row). Compiled once
    per distinct expression (Django's expressions compare and hash by what they say)."""
    try:
        return _compiled(model, expression)
    except TypeError:  # an expression holding something unhashable
        return _compile(model, expression)


@lru_cache(maxsize=1024)
def _compiled(model: type[models.Model], expression: Any) -> tuple[str, tuple[Any, ...]]:
    return _compile(model, expression)


def _compile(model: type[models.Model], expression: Any) -> tuple[str, tuple[Any, ...]]:
    query = Query(model)
    resolved = expression.resolve_expression(query, allow_joins=False, for_save=True)
    sql, params = query.get_compiler(connection=connection).compile(resolved)
    return sql, tuple(params)


@cache
def select_columns(model: type[models.Model], alias: str = "", fields: tuple[str, ...] | None = None
                   ) -> tuple[tuple[str, ...], str]:
    """Attribute names and the SQL column list to load `model` rows with `from_row` (all fields, or
    the attribute names in `fields`: the others are deferred, loaded by Django if ever read)."""
    prefix = f"{alias}." if alias else ""
    chosen = [f for f in model._meta.concrete_fields if fields is None or f.attname in fields]
    return tuple(f.attname for f in chosen), ", ".join(prefix + connection.ops.quote_name(_column(f)) for f in chosen)


@cache
def _converters(model: type[models.Model], fields: tuple[str, ...] | None = None) -> tuple[tuple[Any, ...], ...]:
    return tuple(tuple(f.get_db_converters(connection)) for f in model._meta.concrete_fields
                 if fields is None or f.attname in fields)


def from_row(model: type[_M], row: tuple[Any, ...], fields: tuple[str, ...] | None = None) -> _M:
    """Build an instance from a row selected with `select_columns` (with the same `fields`), converting
    values as the ORM would.

    The instance is what `Model.from_db` builds (core.instances.loaded)."""
    attnames, _ = select_columns(model, fields=fields)
    values = []
    for value, converters in zip(row, _converters(model, fields), strict=True):
        for converter in converters:
            value = converter(value, None, connection)
        values.append(value)
    return instances.loaded(model, DEFAULT_DB_ALIAS, attnames, values)


_COMPARISONS = {"": "= %s", "lt": "< %s", "lte": "<= %s", "gt": "> %s", "gte": ">= %s", "in": "= ANY(%s)"}


@dataclass(frozen=True)
class Together:
    """A write that belongs to a transition: it runs in the transition's statement, and only if the row
    moved. `sql` is one data-modifying statement that reads the statement's `changed` (the moved row's
    id): `INSERT … SELECT … FROM changed`, or `UPDATE … WHERE … AND EXISTS (SELECT FROM changed)`.
    `returns`: its `RETURNING` gives one value, which `transition_returning` answers. `name`: what a
    later write of the same statement reads it by (`also_moving`: another row's move and its audit event).
    """

    sql: str
    params: Sequence[Any] = ()
    returns: bool = False
    name: str = ""


@dataclass(frozen=True)
class AlsoMoving:
    """Another row's guarded move with its audit event, as writes of a transition's statement (`also_moving`)."""

    obj: models.Model
    changes: dict[str, Any]
    event: AuditEvent
    writes: tuple[Together, ...]

    def applied(self, moved_id: Any) -> bool:
        """After the statement: whether the row moved (`moved_id`, what its UPDATE answered), and if it did,
        `changes` put on the object (a value the database computed is read again when first used) and its
        event announced, as `transition` does."""
        if moved_id is None:
            return False
        audit.announce(self.event)
        for name, value in self.changes.items():
            if is_expression(value):
                self.obj.__dict__.pop(_field(type(self.obj), name).attname, None)  # deferred: read on use
            else:
                setattr(self.obj, name, value)
        return True


def also_moving(obj: models.Model, expected: dict[str, Any], changes: dict[str, Any], *, name: str, action: str,
                actor: str, reason: str = "", trace_id: str | None = None, before: dict[str, Any] | None = None,
                after: dict[str, Any] | None = None) -> AlsoMoving:
    """`transition` of `obj`'s row, run inside another transition's statement (its `together`): the row moves
    from `expected` to `changes` only if the transition's own row moved too, and its audit event is written
    only if it did. So two rows of two tables move in one statement, each guarded, each audited.
    `name` names the move in the statement (unique within it)."""
    event = audit.new_event(action=action, obj=obj, actor=actor, reason=reason,
                            trace_id=getattr(obj, "trace_id", "") if trace_id is None else trace_id,
                            before=before, after=after)
    change_shape, expected_shape, params = _update_shape(obj, expected, changes, {})
    update, _ = _update_of(type(obj), change_shape, expected_shape)
    columns, values, event_params, _ = insert_parts(event)
    return AlsoMoving(obj, changes, event, (
        Together(f"{update} AND EXISTS (SELECT FROM changed) RETURNING id", params, returns=True, name=name),
        Together(f"INSERT INTO {table(type(event))} ({', '.join(columns)}) SELECT {', '.join(values)} FROM {name}",
                 event_params),
    ))


def transition(obj: models.Model, expected: dict[str, Any], changes: dict[str, Any], *, action: str, actor: str,
               reason: str = "", trace_id: str | None = None, before: dict[str, Any] | None = None,
               after: dict[str, Any] | None = None,
               append: dict[str, list[Any] | dict[str, Any]] | None = None, notify: str | None = None,
               together: Sequence[Together] = ()) -> bool:
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
    adds items to JSON list fields, or keys to JSON object fields (jsonb `||`). A value of
    `changes` or `expected` may be an ORM expression, e.g. the database's clock (core.clock.NOW, `later`):
    the row's new value is read back from the UPDATE onto `obj`. `notify` names
    a channel that hears the row's id (pg_notify) in the same statement:
    PostgreSQL delivers it when the change commits, never for one that rolls back.
    The statement's text is built once per shape (which fields change, how each
    is expected, which are expressions), so psycopg prepares it. `together`: writes that commit
    with the change in the same statement, or not at all (`Together`).
    """
    return transition_returning(obj, expected, changes, action=action, actor=actor, reason=reason,
                                trace_id=trace_id, before=before, after=after, append=append, notify=notify,
                                together=together) is not None


def transition_returning(obj: models.Model, expected: dict[str, Any], changes: dict[str, Any], *, action: str,
                         actor: str, reason: str = "", trace_id: str | None = None,
                         before: dict[str, Any] | None = None, after: dict[str, Any] | None = None,
                         append: dict[str, list[Any] | dict[str, Any]] | None = None, notify: str | None = None,
                         together: Sequence[Together] = ()) -> tuple[Any, ...] | None:
    """`transition`, answering None if the row did not move, else the values its `together` writes
    returned (those with `returns`, in order)."""
    event = audit.new_event(action=action, obj=obj, actor=actor, reason=reason,
                            trace_id=getattr(obj, "trace_id", "") if trace_id is None else trace_id,
                            before=before, after=after)
    moved = _conditional_update(obj, expected, changes, event, append or {}, notify, together)
    if moved is None:
        return None
    computed, returned = moved
    audit.announce(event)
    for name, value in changes.items():
        setattr(obj, name, computed[name] if name in computed else value)
    for name, items in (append or {}).items():
        now = getattr(obj, name)
        setattr(obj, name, {**now, **items} if isinstance(items, dict) else [*now, *items])
    return returned


def _conditional_update(instance: models.Model, expected: dict[str, Any], changes: dict[str, Any],
                        event: models.Model, append: dict[str, list[Any] | dict[str, Any]],
                        notify: str | None, together: Sequence[Together],
                        ) -> tuple[dict[str, Any], tuple[Any, ...]] | None:
    """None if the row did not match; else the values the database computed (expressions), by field, and
    what the `together` writes returned."""
    model = type(instance)
    change_shape, expected_shape, params = _update_shape(instance, expected, changes, append)
    event_columns, event_values, event_params, _ = insert_parts(event)
    params += event_params
    for write in together:
        params.extend(write.params)
    if notify:
        params.append(notify)
    sql, computed = _update_sql(model, change_shape, expected_shape, tuple(append), type(event),
                                event_columns, event_values, bool(notify),
                                tuple((write.sql, write.returns, write.name) for write in together))
    row = fetchone(sql, params)
    if row is None:
        return None
    returned = sum(write.returns for write in together)
    return ({field.name: converted(field, value) for field, value in zip(computed, row[1:], strict=False)},
            tuple(row[len(row) - returned:]) if returned else ())


@cache
def _update_sql(model: type[models.Model], changes: tuple[tuple[str, str | None], ...],
                expected: tuple[tuple[str, str | None], ...], append_names: tuple[str, ...],
                event_model: type[models.Model], event_columns: tuple[str, ...], event_values: tuple[str, ...],
                notify: bool, together: tuple[tuple[str, bool, str], ...] = (),
                ) -> tuple[str, tuple[models.Field[Any, Any], ...]]:
    """The statement of a transition of this shape, and the fields whose new value the database
    computes (returned after the id, in this order)."""
    update, computed = _update_of(model, changes, expected, append_names)
    quote = connection.ops.quote_name
    returned = "".join(f", {quote(_column(field))}" for field in computed)
    sql = (f"WITH changed AS ({update} RETURNING id{returned}), "
           f"audited AS (INSERT INTO {table(event_model)} ({', '.join(event_columns)}) "
           f"SELECT {', '.join(event_values)} FROM changed)")
    # A data-modifying statement in a WITH runs whether or not the query reads it (and sees the rows as
    # they were before the statement, as every part of it does).
    names = [name or f"together{index}" for index, (_, _, name) in enumerate(together)]
    sql += "".join(f", {name} AS ({write})" for name, (write, _, _) in zip(names, together, strict=True))
    returned = "".join(f", (SELECT * FROM {name})" for name, (_, returns, _) in zip(names, together, strict=True)
                       if returns)
    if notify:
        # A SELECT in a WITH runs only if the query reads it: the last line reads it, so the notice goes out.
        sql += (", notified AS (SELECT pg_notify(%s, id::text) FROM changed) "
                f"SELECT *, (SELECT count(*) FROM notified){returned} FROM changed")
    else:
        sql += f" SELECT *{returned} FROM changed"
    return sql, computed


def _update_shape(instance: models.Model, expected: dict[str, Any], changes: dict[str, Any],
                  append: dict[str, list[Any] | dict[str, Any]]
                  ) -> tuple[tuple[tuple[str, str | None], ...], tuple[tuple[str, str | None], ...], list[Any]]:
    """The shape of a guarded UPDATE of `instance`'s row (which fields change, how each is expected,
    which are expressions: what `_update_of` builds its text from) and its params, in the text's order."""
    model = type(instance)
    wrapper = _wrapper()
    params: list[Any] = []
    change_shape: list[tuple[str, str | None]] = []
    for name, value in changes.items():
        if is_expression(value):
            sql, expression_params = expression_sql(model, value)
            change_shape.append((name, sql))
            params.extend(expression_params)
        else:
            change_shape.append((name, None))
            params.append(_param(*_update_plan(model, name), value, wrapper))
    params += [json.dumps(personal.stored(items), default=str) for items in append.values()]
    params.append(instance.pk)
    expected_shape: list[tuple[str, str | None]] = []
    for key, value in expected.items():
        lookup = key.partition("__")[2]
        if lookup == "isnull" or (lookup == "" and value is None):  # written into the SQL
            expected_shape.append((key, "null" if lookup == "" or value else "not null"))
        elif is_expression(value):
            sql, expression_params = expression_sql(model, value)
            expected_shape.append((key, sql))
            params.extend(expression_params)
        else:
            expected_shape.append((key, None))
            params.append(list(value) if lookup == "in" else value)
    return tuple(change_shape), tuple(expected_shape), params


@cache
def _update_of(model: type[models.Model], changes: tuple[tuple[str, str | None], ...],
               expected: tuple[tuple[str, str | None], ...], append_names: tuple[str, ...] = (),
               ) -> tuple[str, tuple[models.Field[Any, Any], ...]]:
    """`UPDATE … SET … WHERE id = %s AND <expected>` of this shape, and the fields whose new value the
    database computes (expressions)."""
    quote = connection.ops.quote_name
    sets: list[str] = []
    computed: list[models.Field[Any, Any]] = []
    for name, expression in changes:
        field = _field(model, name)
        sets.append(f"{quote(_column(field))} = {expression or '%s'}")
        if expression:
            computed.append(field)
    for name in append_names:
        column = quote(_column(_field(model, name)))
        sets.append(f"{column} = {column} || %s::jsonb")
    conditions = ["id = %s"]
    for key, how in expected:
        name, _, lookup = key.partition("__")
        column = quote(_column(_field(model, name)))
        if how in ("null", "not null"):  # `= NULL` would match nothing
            conditions.append(f"{column} IS {how.upper()}")
        elif how is not None:
            conditions.append(f"{column} {_COMPARISONS[lookup].replace('%s', how)}")
        else:
            conditions.append(f"{column} {_COMPARISONS[lookup]}")
    return f"UPDATE {table(model)} SET {', '.join(sets)} WHERE {' AND '.join(conditions)}", tuple(computed)


def converted(field: models.Field[Any, Any], value: Any) -> Any:
    """A value the database returned for `field`, converted as the ORM would."""
    for converter in _field_converters(field):
        value = converter(value, None, connection)
    return value


@cache
def _field_converters(field: models.Field[Any, Any]) -> tuple[Any, ...]:
    return tuple(field.get_db_converters(connection))


def _wrapper() -> Any:
    """This thread's connection wrapper itself, for a function that hands it on many times: every
    attribute read through Django's `connection` proxy looks the wrapper up again (an asgiref Local,
    about 2 µs), and a JSON field's preparation reads `connection.ops` once per value."""
    return connections[DEFAULT_DB_ALIAS]
