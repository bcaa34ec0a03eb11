"""The key store: the data keys personal values are encrypted under (core.personal), apart from the main database.

- **Where**: a PostgreSQL database of its own, the `keystore` alias of DATABASES: IDEMOPS_KEYSTORE_URL,
  else a second database `<name>_keys` on the main database's server, created on first use. A dump,
  replica or backup of the main database holds ciphertext and key ids only; the keys are here.
- **What**: one data key (AES-256) per tenant and retention period (`period`: the day its values' retention
  ends), stored wrapped (AES-GCM) by the key-encryption key (KEK: IDEMOPS_KEK or IDEMOPS_KEK_FILE; in
  development without either, one made once and kept in the key store itself). Each row names the KEK
  that wrapped it (`kek_id`, a keyed digest of the KEK, never the KEK).
- **Rotation** (`rotate`, `manage.py rotate_kek`): with the new KEK in IDEMOPS_KEK and the old one in
  IDEMOPS_KEK_PREVIOUS, every data key is unwrapped and wrapped again, a row at a time, by a conditional
  UPDATE. Data keys themselves do not change, so no ciphertext is rewritten and writers never wait.
- **Destruction** (`destroy`): the wrapped key is overwritten with NULL and the row kept (`destroyed_at`,
  `destroyed_by`): a value under it reads `[forgotten]`, in the database and in every copy of it.

The key store is reached by a connection of its own (psycopg, autocommit), never through the main
database's transaction: a data key is committed before any value encrypted under it is. It cannot be
reached: `KeyStoreUnavailable` (a `transient` failure), and nothing is written in clear.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import date
from typing import Any

import psycopg
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from django.core.exceptions import ImproperlyConfigured
from django.db import connections, models
from psycopg.conninfo import conninfo_to_dict

from tools_app.conf import conf
from tools_app.core.errors import Transient

ALIAS = "keystore"
TABLE = "idemops_data_key"
DEV_KEK_TABLE = "idemops_development_kek"
KEY_BYTES = 32
NONCE_BYTES = 12
KEK_ID_LABEL = b"idemops:kek-id"
CONNECT_TIMEOUT_SECONDS = 2
# How long a process keeps a data key it unwrapped: a key destroyed elsewhere stops opening here after it.
CACHE_SECONDS = 60.0

SCHEMA = f"""
CREATE TABLE IF NOT EXISTS {TABLE} (
    id uuid PRIMARY KEY,
    tenant_id bigint NOT NULL,
    period date NOT NULL,
    kek_id text NOT NULL,
    wrapped bytea,
    created_at timestamptz NOT NULL DEFAULT now(),
    rewrapped_at timestamptz,
    destroyed_at timestamptz,
    destroyed_by text NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS {DEV_KEK_TABLE} (id int PRIMARY KEY, kek bytea NOT NULL);
CREATE UNIQUE INDEX IF NOT EXISTS {TABLE}_live ON {TABLE} (tenant_id, period) WHERE destroyed_at IS NULL;
"""


class KeyStoreUnavailable(Transient):
    """The key store cannot be reached: nothing personal can be written (nor read) until it can."""


class Router:
    """The key store's database holds no model of the main database, is never migrated, and no read or
    write of a model goes there: core.keystore reaches it by its own connection."""

    def db_for_read(self, model: type[models.Model], **hints: Any) -> str | None:
        return None

    def db_for_write(self, model: type[models.Model], **hints: Any) -> str | None:
        return None

    def allow_migrate(self, db: str, app_label: str, model_name: str | None = None, **hints: Any) -> bool | None:
        return False if db == ALIAS else None


# --- the key-encryption key ---------------------------------------------------------------------------


def _decode_kek(text: str, variable: str) -> bytes:
    try:
        raw = base64.b64decode(text.strip(), validate=True)
    except ValueError:
        raw = b""
    if len(raw) != KEY_BYTES:
        raise ImproperlyConfigured(f"{variable} is not {KEY_BYTES} bytes in base64 (make one with: "
                                   "python -c 'import os, base64; print(base64.b64encode(os.urandom(32)).decode())')")
    return raw


def current_kek() -> bytes:
    settings_ = conf()
    if settings_.kek_file is not None:
        try:
            text = settings_.kek_file.read_text()
        except OSError as exc:
            raise ImproperlyConfigured(f"IDEMOPS_KEK_FILE={settings_.kek_file} cannot be read: {exc}") from None
        return _decode_kek(text, "IDEMOPS_KEK_FILE")
    if settings_.kek is not None:
        return _decode_kek(settings_.kek.get_secret_value(), "IDEMOPS_KEK")
    return _development_kek()


_development_keks: dict[str, bytes] = {}


def _development_kek() -> bytes:
    """Development only (production refuses to start without IDEMOPS_KEK): a KEK made once and kept in the key
    store itself, so every process on the same databases (whatever its var dir and secret key) opens the same
    data keys; a dump of the main database alone still holds none of them."""
    name = _connect_params()["dbname"]
    if name not in _development_keks:
        _execute(f"INSERT INTO {DEV_KEK_TABLE} (id, kek) VALUES (1, %s) ON CONFLICT (id) DO NOTHING",
                 (os.urandom(KEY_BYTES),))
        _development_keks[name] = bytes(_execute(f"SELECT kek FROM {DEV_KEK_TABLE} WHERE id = 1")[0][0])
    return _development_keks[name]


def previous_keks() -> list[bytes]:
    return [_decode_kek(secret.get_secret_value(), "IDEMOPS_KEK_PREVIOUS") for secret in conf().kek_previous]


def kek_id(kek: bytes) -> str:
    return hmac.new(kek, KEK_ID_LABEL, hashlib.sha256).hexdigest()[:16]


def _keks() -> dict[str, bytes]:
    return {kek_id(kek): kek for kek in [current_kek(), *previous_keks()]}


def _aad(key_id: uuid.UUID, tenant_id: int, period: date) -> bytes:
    return f"idemops-data-key\n{key_id}\n{tenant_id}\n{period.isoformat()}".encode()


def _wrap(kek: bytes, key: bytes, aad: bytes) -> bytes:
    nonce = os.urandom(NONCE_BYTES)
    return nonce + AESGCM(kek).encrypt(nonce, key, aad)


def _unwrap(kek: bytes, wrapped: bytes, aad: bytes) -> bytes:
    return AESGCM(kek).decrypt(wrapped[:NONCE_BYTES], wrapped[NONCE_BYTES:], aad)


# --- the connection -------------------------------------------------------------------------------------


def _connect_params() -> dict[str, Any]:
    url = conf().keystore_url
    if url is not None:
        # The URL as configured now, read as libpq reads it (a socket directory in `?host=` included).
        config = {name: value for name, value in conninfo_to_dict(url).items() if value}
        return {**config, "dbname": config.get("dbname", ""), "connect_timeout": CONNECT_TIMEOUT_SECONDS,
                "autocommit": True}
    # A second database on the main database's server, named after the main database as it is now
    # (under the test runner, `test_<name>`: each test database has its own key store).
    main = connections["default"].settings_dict
    params = {"dbname": f"{main['NAME']}_keys", "user": main.get("USER") or None,
              "password": main.get("PASSWORD") or None, "host": main.get("HOST") or None,
              "port": main.get("PORT") or None, "connect_timeout": CONNECT_TIMEOUT_SECONDS, "autocommit": True}
    return {name: value for name, value in params.items() if value is not None}


_local = threading.local()
_schema_ready: set[str] = set()
_schema_lock = threading.Lock()


def _create_database(params: dict[str, Any]) -> None:
    with psycopg.connect(**{**params, "dbname": "postgres"}) as admin:
        try:
            admin.execute(f'CREATE DATABASE "{params["dbname"]}"')
        except (psycopg.errors.DuplicateDatabase, psycopg.errors.UniqueViolation):
            pass  # made meanwhile by another process or thread


def _connection() -> psycopg.Connection[Any]:
    conn: psycopg.Connection[Any] | None = getattr(_local, "conn", None)
    if conn is not None and not conn.closed and not conn.broken:
        return conn
    params = _connect_params()
    try:
        try:
            conn = psycopg.connect(**params)
        except psycopg.OperationalError as exc:
            if conf().keystore_url is not None or "does not exist" not in str(exc):
                raise
            _create_database(params)
            conn = psycopg.connect(**params)
        if params["dbname"] not in _schema_ready:
            # Processes and threads meeting a new key store make its table once, one after the other.
            with _schema_lock, conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(41)")
                conn.execute(SCHEMA)
            _schema_ready.add(params["dbname"])
    except psycopg.Error as exc:
        raise KeyStoreUnavailable(f"the key store cannot be reached ({type(exc).__name__}); nothing was written",
                                  retry_after=5) from exc
    _local.conn = conn
    return conn


def drop_derived() -> None:
    """Drop the key store's database when it is the one derived from the main database's name (a test run's,
    whose main database was just created anew): its keys belong to a database that is gone."""
    if conf().keystore_url is not None:
        return
    close()
    params = _connect_params()
    with psycopg.connect(**{**params, "dbname": "postgres"}) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{params["dbname"]}" WITH (FORCE)')
    _schema_ready.discard(params["dbname"])
    _development_keks.pop(params["dbname"], None)
    forget_cache()


def close() -> None:
    conn = getattr(_local, "conn", None)
    if conn is not None:
        conn.close()
        _local.conn = None


def _execute(sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    # A kept connection the server ended meanwhile (a restart, a failover, an idle timeout) is found dead only
    # when used: it is replaced and the statement tried once more on a fresh one, as Django's health check does
    # for the main database. A fresh connection that fails is the key store being down.
    reused = getattr(_local, "conn", None) is not None
    for attempt in (1, 2):
        try:
            cursor = _connection().execute(sql, params)
            return cursor.fetchall() if cursor.description else []
        except psycopg.OperationalError as exc:
            close()
            if attempt == 1 and reused:
                continue
            raise KeyStoreUnavailable(f"the key store cannot be reached ({type(exc).__name__}); nothing was "
                                      "written", retry_after=5) from exc
    raise AssertionError("unreachable")


# --- data keys ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DataKey:
    id: uuid.UUID
    tenant_id: int
    period: date
    key: bytes | None  # None: destroyed


_lock = threading.Lock()
_by_period: dict[tuple[int, date], tuple[float, DataKey]] = {}
_by_id: dict[uuid.UUID, tuple[float, DataKey]] = {}


def forget_cache() -> None:
    with _lock:
        _by_period.clear()
        _by_id.clear()


def _cached(table: dict[Any, tuple[float, DataKey]], name: Any) -> DataKey | None:
    with _lock:
        entry = table.get(name)
    if entry is None or time.monotonic() - entry[0] > CACHE_SECONDS:
        return None
    return entry[1]


def _remember(key: DataKey) -> None:
    now = time.monotonic()
    with _lock:
        _by_id[key.id] = (now, key)
        if key.key is not None:
            _by_period[(key.tenant_id, key.period)] = (now, key)


def _opened(key_id: uuid.UUID, tenant_id: int, period: date, kek: str, wrapped: bytes | None) -> DataKey:
    if wrapped is None:
        return DataKey(key_id, tenant_id, period, None)
    keks = _keks()
    if kek not in keks:
        raise ImproperlyConfigured(f"IDEMOPS_KEK does not open the key store's data keys (data key {key_id} was "
                                   f"wrapped by the key-encryption key {kek}, which is neither IDEMOPS_KEK nor one "
                                   "of IDEMOPS_KEK_PREVIOUS)")
    try:
        return DataKey(key_id, tenant_id, period, _unwrap(keks[kek], bytes(wrapped), _aad(key_id, tenant_id, period)))
    except InvalidTag:
        raise ImproperlyConfigured(f"IDEMOPS_KEK does not open data key {key_id}: its wrapping is damaged") from None


def for_period(tenant_id: int, period: date) -> DataKey:
    """The live data key of (tenant, period), made on first use."""
    if (cached := _cached(_by_period, (tenant_id, period))) is not None:
        return cached
    kek = current_kek()
    new_id = uuid.uuid4()
    _execute(f"INSERT INTO {TABLE} (id, tenant_id, period, kek_id, wrapped) VALUES (%s, %s, %s, %s, %s) "
             f"ON CONFLICT (tenant_id, period) WHERE destroyed_at IS NULL DO NOTHING",
             (new_id, tenant_id, period, kek_id(kek),
              _wrap(kek, os.urandom(KEY_BYTES), _aad(new_id, tenant_id, period))))
    rows = _execute(f"SELECT id, kek_id, wrapped FROM {TABLE} WHERE tenant_id = %s AND period = %s "
                    "AND destroyed_at IS NULL", (tenant_id, period))
    key = _opened(rows[0][0], tenant_id, period, rows[0][1], rows[0][2])
    _remember(key)
    return key


def by_id(key_id: uuid.UUID) -> DataKey | None:
    """The data key `key_id` (its `key` None once destroyed), or None if the key store has no such key."""
    if (cached := _cached(_by_id, key_id)) is not None:
        return cached
    rows = _execute(f"SELECT tenant_id, period, kek_id, wrapped FROM {TABLE} WHERE id = %s", (key_id,))
    if not rows:
        return None
    key = _opened(key_id, *rows[0])
    _remember(key)
    return key


def verify_kek() -> int:
    """Open every live data key with the configured KEKs (ImproperlyConfigured, naming IDEMOPS_KEK, if one
    does not open); the number of live keys."""
    rows = _execute(f"SELECT id, tenant_id, period, kek_id, wrapped FROM {TABLE} WHERE destroyed_at IS NULL")
    for row in rows:
        _opened(*row)
    return len(rows)


def rotate(*, batch: int = 100) -> int:
    """Wrap every data key not wrapped by the current KEK again under it; the number rewrapped. Each row by a
    conditional UPDATE (its wrapping unchanged since it was read): a writer or a destroyer never waits."""
    kek = current_kek()
    current = kek_id(kek)
    rewrapped = 0
    while True:
        rows = _execute(f"SELECT id, tenant_id, period, kek_id, wrapped FROM {TABLE} WHERE destroyed_at IS NULL "
                        "AND kek_id <> %s ORDER BY created_at LIMIT %s", (current, batch))
        if not rows:
            return rewrapped
        for key_id, tenant_id, period, old, wrapped in rows:
            key = _opened(key_id, tenant_id, period, old, wrapped)
            assert key.key is not None
            done = _execute(f"UPDATE {TABLE} SET wrapped = %s, kek_id = %s, rewrapped_at = now() WHERE id = %s "
                            "AND kek_id = %s AND destroyed_at IS NULL RETURNING id",
                            (_wrap(kek, key.key, _aad(key_id, tenant_id, period)), current, key_id, old))
            rewrapped += len(done)


def expired(today: date) -> list[DataKey]:
    """The live data keys whose period ended before `today` (their key not unwrapped)."""
    rows = _execute(f"SELECT id, tenant_id, period FROM {TABLE} WHERE destroyed_at IS NULL AND period < %s "
                    "ORDER BY period, id", (today,))
    return [DataKey(key_id, tenant_id, period, None) for key_id, tenant_id, period in rows]


def destroy(key_id: uuid.UUID, *, by: str) -> bool:
    """Overwrite the data key: whatever it encrypted, anywhere, can no longer be read. True if it was live."""
    done = _execute(f"UPDATE {TABLE} SET wrapped = NULL, destroyed_at = now(), destroyed_by = %s "
                    "WHERE id = %s AND destroyed_at IS NULL RETURNING id", (by, key_id))
    with _lock:
        _by_id.pop(key_id, None)
        for name, (_, key) in list(_by_period.items()):
            if key.id == key_id:
                del _by_period[name]
    return bool(done)


def counts() -> dict[str, int]:
    """Live and destroyed data keys, and live ones by the KEK that wraps them (`kek:<id>`)."""
    rows = _execute(f"SELECT destroyed_at IS NULL, kek_id, count(*) FROM {TABLE} GROUP BY 1, 2")
    found = {"live": 0, "destroyed": 0}
    for live, kek, count in rows:
        found["live" if live else "destroyed"] += count
        if live:
            found[f"kek:{kek}"] = count
    return found


# --- after a fork ------------------------------------------------------------------------------------------

_inherited: list[Any] = []


def _forget_after_fork() -> None:
    """A forked child (django-q2's workers, a storm's callers) opens a connection of its own. The parent's is
    not the child's to use: two processes on one socket corrupt each other's session. Nor to close: closing
    would end the parent's session on the server, so the inherited one is kept, unused, for the child's life.
    A lock held by another thread at the fork is released in the child by making it anew."""
    global _local, _lock, _schema_lock
    _inherited.append(_local)
    _local = threading.local()
    _lock = threading.Lock()
    _schema_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)
