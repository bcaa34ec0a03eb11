"""The engine's own reads and rows (`core.db.fetchone`, `core.db.from_row`, `core.instances`,
`core.db.insert_parts`) give what the ORM gives: the same times, the same instances, and every
listener still called."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence
from typing import Any

import pytest
from django.db import DataError, connection, transaction
from django.db.models import Value
from django.db.models.signals import post_init
from psycopg.types.json import Jsonb

from tools_app import access, engine
from tools_app.core import clock, db, instances
from tools_app.engine.claims import REPLAY_FIELDS
from tools_app.models import AuditEvent, IdempotencyRecord, Tenant

pytestmark = pytest.mark.django_db(transaction=True)

TIMES = [dt.datetime(1, 1, 1, tzinfo=dt.UTC), dt.datetime(2026, 12, 5, 1, 2, 3, 456789, tzinfo=dt.UTC),
         dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=dt.UTC)]


def _orm_reads(sql: str, params: Sequence[Any]) -> tuple[object, ...] | None:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row: tuple[object, ...] | None = cursor.fetchone()
        return row


@pytest.mark.parametrize("named", [False, True], ids=["numbered", "psycopg-parsed"])
def test_times_read_on_the_hot_path_are_the_orms(named: bool) -> None:
    if named:
        sql, params = "SELECT %(a)s::timestamptz, %(b)s::timestamptz, %(c)s::timestamptz, now()", dict(
            zip("abc", TIMES, strict=True))
        row = db.fetchone(sql, params)  # type: ignore[arg-type]
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            orm = cursor.fetchone()
    else:
        sql = "SELECT %s::timestamptz, %s::timestamptz, %s::timestamptz, now()"
        row, orm = db.fetchone(sql, TIMES), _orm_reads(sql, TIMES)
    assert row is not None and orm is not None
    assert list(row[:3]) == TIMES == list(orm[:3])
    assert all(value.tzinfo is dt.UTC for value in [*row, *orm])


def test_a_session_in_another_time_zone_reads_as_django_does() -> None:
    """psycopg's loader would give the session's zone; Django's attaches UTC to whatever it got. Where
    the two part, the hot path reads as Django does."""
    sql = "SELECT %s::timestamptz"
    assert db.fetchone(sql, [TIMES[1]]) == (TIMES[1],)  # the connection's kept cursor reads times in C
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL TIME ZONE 'Asia/Kolkata'")
        row, orm = db.fetchone(sql, [TIMES[1]]), _orm_reads(sql, [TIMES[1]])
    assert row == orm and row is not None and row[0].tzinfo is dt.UTC


def test_the_kept_cursor_outlives_an_error_and_a_new_connection_gets_its_own() -> None:
    db.fetchone("SELECT 1", [])
    with pytest.raises(DataError), transaction.atomic():
        db.fetchone("SELECT 1 / %s", [0])
    assert db.fetchone("SELECT %s::int + 1", [1]) == (2,)
    before = connection.connection
    connection.close()
    assert db.fetchone("SELECT %s::int + 2", [1]) == (3,) and connection.connection is not before
    with connection.cursor() as cursor:  # the ORM on the same connection, in between
        cursor.execute("SELECT 4")
    assert db.fetchone("SELECT %(x)s::int * 2", {"x": 2}) == (4,)  # type: ignore[arg-type]


def _kept() -> dict[str, Any]:
    return connection.connection.__dict__.get("_idemops_cursors", {})


def test_each_statement_keeps_its_own_cursor_and_its_adapters_and_the_least_recently_used_is_closed() -> None:
    """A first call alternates its claim and its mark: each statement's cursor keeps the adapters psycopg found
    for its parameters (its transformer, replaced whenever a cursor runs another text), at most KEPT_CURSORS."""
    first, second = "SELECT %s::int + 1, 'first'", "SELECT %s::text || 'x', 'second'"
    assert db.fetchone(first, [1]) == (2, "first")
    kept_first = _kept()[db._numbered(first) or first]
    adapters = kept_first._tx  # psycopg's transformer of that cursor: the dumpers and loaders it found
    assert db.fetchone(second, ["a"]) == ("ax", "second")
    assert db.fetchone(first, [2]) == (3, "first")
    assert _kept()[db._numbered(first) or first] is kept_first and kept_first._tx is adapters
    assert _kept()[db._numbered(second) or second] is not kept_first

    others = [f"SELECT %s::int + {n}" for n in range(db.KEPT_CURSORS)]
    for n, sql in enumerate(others):
        assert db.fetchone(sql, [1]) == (n + 1,)
    assert len(_kept()) == db.KEPT_CURSORS and (db._numbered(first) or first) not in _kept()
    assert kept_first.closed  # the least recently used, closed as it was let go
    assert db.fetchone(first, [3]) == (4, "first")  # and run again on a cursor of its own


def test_a_kept_cursor_holds_no_result_once_its_row_is_read() -> None:
    """A replay's row can carry a large tool result: the cursor kept for the statement lets it go."""
    big = "x" * 1_000_000
    sql = "SELECT %s::text, 'held?'"
    assert db.fetchone(sql, [big]) == (big, "held?")
    kept = _kept()[db._numbered(sql) or sql]
    assert kept.pgresult is None and kept._tx.pgresult is None  # the cursor's and its transformer's
    assert db.fetchone(sql, ["again"]) == ("again", "held?")  # and the statement runs again on it


def _record() -> IdempotencyRecord:
    tenant = access.create_tenant(f"rows-{uuid.uuid4().hex[:6]}")
    op = engine.Operation(tenant_id=tenant.pk, tool="rows", key=uuid.uuid4().hex, arguments={"a": [1, "b"]},
                          actor="agent:rows/test")
    engine.run(op, lambda record: {"ok": True})
    return IdempotencyRecord.objects.get(tenant=tenant)


@pytest.mark.parametrize("fields", [None, REPLAY_FIELDS], ids=["every-field", "replay-fields"])
def test_from_row_builds_what_from_db_builds(fields: tuple[str, ...] | None) -> None:
    stored = _record()
    attnames, select_list = db.select_columns(IdempotencyRecord, fields=fields)
    row = db.fetchone(f"SELECT {select_list} FROM {db.table(IdempotencyRecord)} WHERE id = %s", [stored.pk])
    assert row is not None
    built = db.from_row(IdempotencyRecord, row, fields=fields)
    orm = IdempotencyRecord.objects.only(*attnames).get(pk=stored.pk) if fields else stored
    assert {k: v for k, v in built.__dict__.items() if k != "_state"} == {
        k: v for k, v in orm.__dict__.items() if k != "_state"}
    assert built.get_deferred_fields() == orm.get_deferred_fields() == (
        set() if fields is None else {f.attname for f in IdempotencyRecord._meta.concrete_fields} - set(fields))
    assert (built._state.adding, built._state.db) == (False, "default")
    assert built == orm and built.status == orm.status and built.tenant_id == orm.tenant_id
    if fields:
        assert built.attempts == stored.attempts  # a deferred field loads when read, as the ORM's would


def test_from_row_still_calls_init_listeners() -> None:
    stored = _record()
    seen: list[int] = []

    def listener(sender: type, instance: IdempotencyRecord, **kwargs: object) -> None:
        seen.append(instance.pk)

    _, select_list = db.select_columns(IdempotencyRecord)
    row = db.fetchone(f"SELECT {select_list} FROM {db.table(IdempotencyRecord)} WHERE id = %s", [stored.pk])
    assert row is not None
    post_init.connect(listener, sender=IdempotencyRecord)
    try:
        db.from_row(IdempotencyRecord, row)
    finally:
        post_init.disconnect(listener, sender=IdempotencyRecord)
    assert seen == [stored.pk]


def test_is_expression_tells_the_clock_from_values() -> None:
    assert db.is_expression(clock.NOW) and db.is_expression(clock.later(10))
    values: list[object] = ["NOW", 1, 1.5, True, None, {"a": 1}, [1], uuid.uuid4(), TIMES[0], TIMES[0].date(),
                            type("Text", (str,), {})("x")]
    assert not any(db.is_expression(value) for value in values)


def _fields(instance: object) -> dict[str, object]:
    return {name: value for name, value in vars(instance).items() if name != "_state"}


def test_unsaved_builds_what_the_constructor_builds() -> None:
    stored = _record()
    event = dict(tenant_id=stored.tenant_id, actor="agent:rows/test", action="record.claimed",
                 object_type="idempotencyrecord", object_id=str(stored.pk), after={"status": "processing"},
                 created_at=TIMES[1])
    for model, values in [(AuditEvent, event), (IdempotencyRecord, {"tenant_id": stored.tenant_id, "tool": "t",
                                                                     "key": "k", "expires_at": clock.NOW})]:
        built, django = instances.unsaved(model, **values), model(**values)
        assert _fields(built) == _fields(django) and set(_fields(built)) == {
            f.attname for f in model._meta.concrete_fields}
        assert (built._state.adding, built._state.db) == (True, None) == (django._state.adding, django._state.db)
    # A default made by a function is made anew for each instance, as Django's constructor makes it.
    first, second = instances.unsaved(IdempotencyRecord), instances.unsaved(IdempotencyRecord)
    assert first.arguments == {} and first.arguments is not second.arguments
    assert first.evidence == [] and first.evidence is not second.evidence
    # A value named by its relation (not its attribute name) is Django's to resolve.
    tenant = Tenant.objects.get(pk=stored.tenant_id)
    by_relation = instances.unsaved(AuditEvent, tenant=tenant, actor="a", action="b")
    assert by_relation.tenant_id == tenant.pk and by_relation.tenant == tenant


def test_unsaved_keeps_related_objects_as_the_constructor_does(django_assert_num_queries: Any) -> None:
    stored = _record()
    tenant = Tenant.objects.get(pk=stored.tenant_id)
    built = instances.unsaved(AuditEvent, {"tenant": tenant}, actor="a", action="b")
    django = AuditEvent(tenant=tenant, actor="a", action="b")
    assert _fields(built) == _fields(django) and built.tenant_id == tenant.pk
    with django_assert_num_queries(0):
        assert built.tenant is tenant  # kept, not read again
    assert instances.unsaved(AuditEvent, {"tenant": None}, actor="a").tenant_id is None
    # With a listener, Django builds it, the related object given as such.
    post_init.connect(_ignore, sender=AuditEvent)
    try:
        by_django = instances.unsaved(AuditEvent, {"tenant": tenant}, actor="a", action="b")
    finally:
        post_init.disconnect(_ignore, sender=AuditEvent)
    assert by_django.tenant_id == tenant.pk and by_django.tenant is tenant


def _ignore(sender: type, **kwargs: object) -> None:
    pass


def test_unsaved_still_calls_init_listeners() -> None:
    seen: list[str] = []

    def listener(sender: type, instance: AuditEvent, **kwargs: object) -> None:
        seen.append(instance.action)

    post_init.connect(listener, sender=AuditEvent)
    try:
        instances.unsaved(AuditEvent, actor="a", action="heard")
    finally:
        post_init.disconnect(listener, sender=AuditEvent)
    assert seen == ["heard"]


def test_insert_parts_names_the_fields_the_database_computes() -> None:
    record = engine.new_record(engine.Operation(tenant_id=_record().tenant_id, tool="rows", key="parts",
                                                arguments={"a": 1}, actor="agent:rows/test"))
    parts = db.insert_parts(record)
    computed = {field.attname for field in parts.computed}
    assert computed == {"created_at", "updated_at", "expires_at", "lease_expires_at"}
    by_column = dict(zip(parts.columns, parts.values, strict=True))
    assert {name for name, value in by_column.items() if value != "%s"} == {
        connection.ops.quote_name(str(field.column)) for field in parts.computed}
    assert len(parts.params) == sum(value.count("%s") for value in parts.values)
    given = db.insert_parts(record, {"key": "'given'"})
    assert dict(zip(given.columns, given.values, strict=True))['"key"'] == "'given'"
    assert len(given.params) == len(parts.params) - 1


@pytest.mark.parametrize("value", [{"a": [1, 2.5, None, True]}, [1, "two"], "text", 7, 2.5, False, None,
                                   Value(None, IdempotencyRecord._meta.get_field("attributes")),
                                   type("Text", (str,), {})("x")],
                         ids=["object", "list", "text", "int", "float", "bool", "sql-null", "json-null",
                              "str-subclass"])
def test_insert_parts_prepares_each_value_as_django_does(value: object) -> None:
    """A JSON field's value (Django's own JSONField, a PersonalJSONField holding the same value) and every other
    field's: the parameter `insert_parts`, or a transition's UPDATE, sends is the one Django's `get_db_prep_save`
    prepares, written to the same JSON text."""
    record = engine.new_record(engine.Operation(tenant_id=_record().tenant_id, tool="rows", key="prep",
                                                arguments={"a": 1}, actor="agent:rows/test"))
    record.attributes = value
    record.result = value
    parts = db.insert_parts(record)
    expected: list[object] = []
    for field in IdempotencyRecord._meta.concrete_fields[1:]:  # all but the id
        held = getattr(record, field.attname)
        if db.is_expression(held):  # the database's clock: its SQL's parameters
            expected += db.expression_sql(IdempotencyRecord, held)[1]
        else:
            expected.append(field.get_db_prep_save(held, connection))
    assert len(parts.params) == len(expected)
    for sent, django in zip(parts.params, expected, strict=True):
        if isinstance(django, Jsonb):
            assert isinstance(sent, Jsonb) and sent.dumps(sent.obj) == django.dumps(django.obj)
        else:  # psycopg adapts the value itself (Django's preparation may wrap an int, e.g. Int2(2) == 2)
            assert sent == django
    if db.is_expression(value):
        return  # an UPDATE sets it by its SQL, which takes no parameter of it
    # A transition's UPDATE prepares what it sets alike (core.db.transition).
    record.pk = 1
    set_to = {"attributes": value, "result": value, "attempts": 2}
    _, _, update_params = db._update_shape(record, {}, set_to, {})
    django_params = [IdempotencyRecord._meta.get_field(name).get_db_prep_save(held, connection)
                     for name, held in set_to.items()]
    for sent, django in zip(update_params, django_params, strict=False):  # then the row's id
        assert type(sent) is type(django)
        assert sent.dumps(sent.obj) == django.dumps(django.obj) if isinstance(django, Jsonb) else sent == django
