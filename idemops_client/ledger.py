"""The call ledger: what this agent submitted, with which key, and what became of it.

One entry per operation: (session, tool, call id), where the call id is the
caller's explicit key or the key derived from the canonical arguments. The
entry is written as `submitted` before the request leaves, so a crash
between sending and hearing back leaves a record to ask about again with the
same key, instead of a blank that invites a second operation.

`LedgerStore` is the interface; `Ledger` keeps entries in SQLite (stdlib
`sqlite3`, WAL, one short transaction per change, so asyncio tasks in one
process and several processes on one file can share it); `MemoryLedger`
keeps them in a dict. Entries expire (`ttl`, 24 hours by default, the
server's default retention); expired entries are ignored and purged. An
entry whose key the server says is bound to an unfinished task (its answer's
`idempotency.expires_at` is null: start_task, fork_task, a long tool's own
call) does not expire (`expires_at` is HELD) until an answer or a refresh
says the task ended; its `ttl` then counts from then (`follow_server_expiry`).
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from idemops_client.entries import HELD, Entry, State
from idemops_client.errors import ClientError

__all__ = ["DEFAULT_TTL_SECONDS", "HELD", "Entry", "Ledger", "LedgerError", "LedgerStore", "MemoryLedger",
           "SessionLedger", "State"]

DEFAULT_TTL_SECONDS = 24 * 3600

class LedgerStore(ABC):
    """Where entries live. Every method is one atomic step; implementations must be
    safe for concurrent callers (tasks, threads, and for shared stores, processes)."""

    def __init__(self, ttl: float = DEFAULT_TTL_SECONDS):
        self.ttl = ttl

    @abstractmethod
    def get(self, session_id: str, tool: str, call_id: str) -> Entry | None:
        """The live (unexpired) entry, or None."""

    @abstractmethod
    def add(self, entry: Entry) -> Entry:
        """Store `entry` unless a live one with its identity exists; return whichever is stored.

        Two processes adding the same call at once both get the one entry that won.
        """

    @abstractmethod
    def save(self, entry: Entry) -> None:
        """Overwrite the stored entry with this identity."""

    @abstractmethod
    def entries(self, session_id: str) -> list[Entry]:
        """The session's live entries, oldest first."""

    @abstractmethod
    def purge_expired(self) -> int:
        """Delete expired entries; return how many."""

    def close(self) -> None:  # noqa: B027 (optional for stores without resources)
        pass

    def new_entry(self, **fields: Any) -> Entry:
        now = time.time()
        return Entry(created_at=now, updated_at=now, expires_at=now + self.ttl, **fields)

    def follow_server_expiry(self, entry: Entry, idempotency: dict[str, Any]) -> None:
        """The server's word on the key's expiry (an answer's `idempotency` block, or get_operation's):
        null while the task the key started is unfinished (the entry is HELD); a time once it ended
        (a held entry is then kept `ttl` from now). Without the word, the expiry stands."""
        if "expires_at" not in idempotency:
            return
        if idempotency["expires_at"] is None:
            entry.expires_at = HELD
        elif entry.held:
            entry.expires_at = time.time() + self.ttl

    def summary_for_model(self, session_id: str, limit: int = 20) -> str:
        from idemops_client.summary import render

        return render(self.entries(session_id), limit=limit)


class MemoryLedger(LedgerStore):
    """Entries in this process's memory: gone when it exits."""

    def __init__(self, ttl: float = DEFAULT_TTL_SECONDS):
        super().__init__(ttl)
        self._entries: dict[tuple[str, str, str], Entry] = {}
        self._lock = threading.Lock()

    def get(self, session_id: str, tool: str, call_id: str) -> Entry | None:
        with self._lock:
            entry = self._entries.get((session_id, tool, call_id))
            return replace(entry) if entry is not None and not entry.expired() else None

    def add(self, entry: Entry) -> Entry:
        with self._lock:
            identity = (entry.session_id, entry.tool, entry.call_id)
            existing = self._entries.get(identity)
            if existing is None or existing.expired():
                self._entries[identity] = replace(entry)
                return replace(entry)
            return replace(existing)

    def save(self, entry: Entry) -> None:
        with self._lock:
            self._entries[(entry.session_id, entry.tool, entry.call_id)] = replace(entry, updated_at=time.time())

    def entries(self, session_id: str) -> list[Entry]:
        with self._lock:
            now = time.time()
            return sorted((replace(e) for e in self._entries.values()
                           if e.session_id == session_id and not e.expired(now)), key=lambda e: e.created_at)

    def purge_expired(self) -> int:
        with self._lock:
            now = time.time()
            dead = [k for k, e in self._entries.items() if e.expired(now)]
            for k in dead:
                del self._entries[k]
            return len(dead)


_SCHEMA = """
CREATE TABLE IF NOT EXISTS calls (
    session_id TEXT NOT NULL,
    tool TEXT NOT NULL,
    call_id TEXT NOT NULL,
    key TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    arguments TEXT NOT NULL,
    state TEXT NOT NULL,
    operation_id TEXT,
    result TEXT,
    error TEXT,
    attempts INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    PRIMARY KEY (session_id, tool, call_id)
);
CREATE INDEX IF NOT EXISTS calls_expiry ON calls (expires_at);
"""
_COLUMNS = ("session_id", "tool", "call_id", "key", "fingerprint", "arguments", "state", "operation_id", "result",
            "error", "attempts", "created_at", "updated_at", "expires_at")
_JSON_COLUMNS = ("arguments", "result", "error")


class LedgerError(ClientError):
    """The ledger file cannot be used (corrupt, read-only, locked, missing directory). Raised before
    anything is sent: a call that cannot be written down first is not made."""


@contextlib.contextmanager
def _explained(path: str, doing: str) -> Iterator[None]:
    try:
        yield
    except sqlite3.Error as exc:
        text = str(exc).lower()
        if "not a database" in text or "malformed" in text:
            why = "it is not a ledger (a corrupt or foreign file): move it aside, or point --ledger elsewhere"
        elif "readonly" in text or "read-only" in text or _on_read_only_file_system(path):
            why = "it is read-only: make the file and its directory writable, or point --ledger elsewhere"
        elif "locked" in text or "busy" in text:
            why = ("it is locked by another process that holds a write transaction: wait for it to finish, "
                   "or give this agent a ledger of its own")
        elif "unable to open" in text:
            why = "it cannot be opened: does its directory exist and is it writable?"
        else:
            why = str(exc)
        raise LedgerError(f"ledger {path}: cannot {doing}: {why} ({type(exc).__name__}: {exc})") from exc


def _on_read_only_file_system(path: str) -> bool:
    """Whether the file's directory is mounted read-only (SQLite then says only "unable to open": a
    ledger in WAL mode needs its -wal and -shm files beside it, even to read)."""
    if path == ":memory:":
        return False
    try:
        return bool(os.statvfs(os.path.dirname(os.path.abspath(path))).f_flag & os.ST_RDONLY)
    except OSError:
        return False


class Ledger(LedgerStore):
    """Entries in a SQLite file (or ":memory:"), shared by every task, thread and process that opens it.

    A file that cannot serve as a ledger raises LedgerError here, and so does any step later
    (a lock held past `busy_timeout`): the message names the file and what to do."""

    def __init__(self, path: str | Path = "calls.sqlite", ttl: float = DEFAULT_TTL_SECONDS,
                 busy_timeout: float = 10.0):
        super().__init__(ttl)
        self.path = str(path)
        # One connection, one lock: each method is a single short transaction, and
        # sqlite3 objects must not be used by two threads at once.
        self._lock = threading.Lock()
        with _explained(self.path, "open it"):
            self._db = sqlite3.connect(self.path, timeout=busy_timeout, isolation_level=None,
                                       check_same_thread=False)
            if self.path != ":memory:":
                # WAL: readers never block the writer, and a second process can work on the file at once.
                self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL" if self.path != ":memory:" else "PRAGMA synchronous=OFF")
            with self._lock:
                self._db.executescript(_SCHEMA)
                # A read-only file opens and reads; say so now, not at the first call.
                self._db.execute("BEGIN IMMEDIATE")
                self._db.execute("ROLLBACK")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _row(self, row: tuple[Any, ...] | None) -> Entry | None:
        if row is None:
            return None
        values = dict(zip(_COLUMNS, row, strict=True))
        for name in _JSON_COLUMNS:
            values[name] = json.loads(values[name]) if values[name] is not None else None
        values["state"] = State(values["state"])
        return Entry(**values)

    def _values(self, entry: Entry) -> tuple[Any, ...]:
        values = {name: getattr(entry, name) for name in _COLUMNS}
        for name in _JSON_COLUMNS:
            values[name] = json.dumps(values[name], ensure_ascii=False) if values[name] is not None else None
        values["state"] = str(entry.state)
        return tuple(values[name] for name in _COLUMNS)

    def get(self, session_id: str, tool: str, call_id: str) -> Entry | None:
        with self._lock, _explained(self.path, "read it"):
            row = self._db.execute(
                f"SELECT {', '.join(_COLUMNS)} FROM calls WHERE session_id = ? AND tool = ? AND call_id = ? "
                "AND expires_at > ?", (session_id, tool, call_id, time.time())).fetchone()
        return self._row(row)

    def add(self, entry: Entry) -> Entry:
        placeholders = ", ".join("?" for _ in _COLUMNS)
        with self._lock, _explained(self.path, "record the call (nothing was sent)"):
            # IMMEDIATE: take the write lock first, so a second process adding the
            # same call waits and then reads the winner's entry.
            self._db.execute("BEGIN IMMEDIATE")  # a lock held too long raises here, with nothing to roll back
            try:
                # Only an expired entry is replaced; a live one wins.
                self._db.execute(
                    f"INSERT INTO calls ({', '.join(_COLUMNS)}) VALUES ({placeholders}) "
                    "ON CONFLICT (session_id, tool, call_id) DO UPDATE SET "
                    + ", ".join(f"{c} = excluded.{c}" for c in _COLUMNS[3:])
                    + " WHERE calls.expires_at <= ?", (*self._values(entry), time.time()))
                row = self._db.execute(
                    f"SELECT {', '.join(_COLUMNS)} FROM calls WHERE session_id = ? AND tool = ? AND call_id = ?",
                    (entry.session_id, entry.tool, entry.call_id)).fetchone()
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        stored = self._row(row)
        assert stored is not None
        return stored

    def save(self, entry: Entry) -> None:
        entry.updated_at = time.time()
        assignments = ", ".join(f"{c} = ?" for c in _COLUMNS[3:])
        values = self._values(entry)
        with self._lock, _explained(self.path, "record the answer"):
            self._db.execute(f"UPDATE calls SET {assignments} WHERE session_id = ? AND tool = ? AND call_id = ?",
                             (*values[3:], *values[:3]))

    def entries(self, session_id: str) -> list[Entry]:
        with self._lock, _explained(self.path, "read it"):
            rows = self._db.execute(
                f"SELECT {', '.join(_COLUMNS)} FROM calls WHERE session_id = ? AND expires_at > ? "
                "ORDER BY created_at, rowid", (session_id, time.time())).fetchall()
        return [entry for row in rows if (entry := self._row(row)) is not None]

    def purge_expired(self) -> int:
        with self._lock, _explained(self.path, "purge it"):
            return self._db.execute("DELETE FROM calls WHERE expires_at <= ?", (time.time(),)).rowcount


class SessionLedger:
    """A ledger seen through one session: what `IdempotentClient.ledger` is."""

    def __init__(self, store: LedgerStore, session_id: str):
        self.store = store
        self.session_id = session_id

    def entries(self) -> list[Entry]:
        return self.store.entries(self.session_id)

    def summary_for_model(self, limit: int = 20) -> str:
        return self.store.summary_for_model(self.session_id, limit=limit)
