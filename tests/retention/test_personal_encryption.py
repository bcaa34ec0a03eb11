"""Personal values are stored encrypted under a data key of the key store (a database apart), read back
whole by the engine, `[personal]` for readers not allowed to see them, `[forgotten]` once their key is
destroyed, `[unreadable]` when damaged; the key store unreachable answers `transient` and writes nothing."""

import json

import pytest
from django.db import connection

from tools_app.core import keystore, personal
from tools_app.models import IdempotencyRecord
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
    from idemops.conf import override_conf

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
