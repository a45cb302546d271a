"""SQLite store: the embedded default, one file that survives restarts.

Two threads, each owning its own connection: one writes (a batch of saves is one transaction: group
commit, see gateway.store.writer), one reads, so the event loop never blocks on disk, no connection is
shared between threads, and a read never queues behind a commit (WAL lets readers run while a writer
writes, in this process and in other gateway processes on the same host). `synchronous=NORMAL` keeps
every committed save across a process crash (a power cut may lose the last few). Retention is enforced
on every commit, and expired rows are invisible to reads before that.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from gateway.store import Item, StoreError, codec
from gateway.store.codec import LogprobList
from gateway.store.writer import Write

T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    seq INTEGER PRIMARY KEY,         -- save order: count pruning drops the lowest
    id TEXT NOT NULL UNIQUE,
    saved_at REAL NOT NULL,          -- unix seconds: age pruning
    response BLOB NOT NULL,          -- the Response (store.codec: compact; JSON in files of earlier versions)
    input_items BLOB NOT NULL,       -- its input items, a list (the same)
    events BLOB                      -- a background response's stream events, a list (the same)
);
CREATE INDEX IF NOT EXISTS responses_saved_at ON responses (saved_at);
-- Where each stored item is (an item_reference names it); rows go with their response.
CREATE TABLE IF NOT EXISTS items (
    key TEXT PRIMARY KEY,            -- the item's id in its caller's scope (store.item_keys)
    response_id TEXT NOT NULL REFERENCES responses (id) ON DELETE CASCADE
);
CREATE INDEX IF NOT EXISTS items_response_id ON items (response_id);
-- How many rows `responses` has, kept by triggers (in every writer's transaction, whichever process):
-- count pruning needs it at each commit, and finding the max_responses-th newest row by OFFSET walks
-- that many rows (~4.5 ms a commit with 2,000 stored, ~8.5 with 5,000).
CREATE TABLE IF NOT EXISTS response_count (n INTEGER NOT NULL);
CREATE TRIGGER IF NOT EXISTS responses_counted_in AFTER INSERT ON responses
    BEGIN UPDATE response_count SET n = n + 1; END;
CREATE TRIGGER IF NOT EXISTS responses_counted_out AFTER DELETE ON responses
    BEGIN UPDATE response_count SET n = n - 1; END;
"""


# A new id (nearly every save) takes one statement; the DELETE that a save of a stored id needs first (one
# per row, finding nothing) was ~10% of the writer thread's SQLite time.
_INSERT_NEW = ("INSERT INTO responses (id, saved_at, response, input_items, events) VALUES (?, ?, ?, ?, ?) "
               "ON CONFLICT (id) DO NOTHING")


# The writer thread's niceness above the event loop's (Linux, where it is per thread): its deflating and
# commits are background work. At the same priority it preempted the loop mid-request when both shared a
# core (per-thread counts, c=1, gateway pinned: the loop preempted 0.13-0.23 times a request, niced
# 0.10-0.11; p90 3.0-3.6 against 3.0-4.4 ms on a slow host). Niced, it runs in the loop's idle time, and
# gets ~10% of a core while the loop is busy (CFS weights): when that is less than its saves need
# (~0.15 ms each), the queue fills, saves wait for room (WriteBehind), the loop goes idle and it catches up.
WRITER_NICENESS = 10


def _in_the_background() -> None:
    """Lower the calling thread's scheduling priority by WRITER_NICENESS (Linux only: elsewhere the call
    would name the whole process)."""
    if sys.platform != "linux":
        return
    thread = threading.get_native_id()
    with contextlib.suppress(OSError):  # not permitted (a sandbox): the writer keeps the loop's priority
        os.setpriority(os.PRIO_PROCESS, thread, min(19, os.getpriority(os.PRIO_PROCESS, thread) + WRITER_NICENESS))


# How long a statement waits out another process's lock before it fails.
BUSY_TIMEOUT_SECONDS = 10.0


def _switch_to_wal(db: sqlite3.Connection) -> None:
    """PRAGMA journal_mode=WAL, waiting out another process that holds the file's lock meanwhile.

    SQLite fails that pragma at once with SQLITE_BUSY instead of calling the busy handler: two workers
    opening a new file together failed it 123 times in 200 here (one worker then exits, and is restarted).
    """
    deadline = time.monotonic() + BUSY_TIMEOUT_SECONDS
    pause = 0.005
    while True:
        try:
            db.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorcode & 0xFF != sqlite3.SQLITE_BUSY or time.monotonic() + pause > deadline:
                raise
        time.sleep(pause)
        pause = min(0.1, pause * 2)


class SQLiteStore:
    def __init__(self, path: Path, *, ttl_seconds: int, max_responses: int,
                 clock: Callable[[], float] = time.time) -> None:
        self.path = path
        self.ttl_seconds = ttl_seconds
        self.max_responses = max_responses
        self._clock = clock
        self._executor: ThreadPoolExecutor | None = None
        self._reader: ThreadPoolExecutor | None = None
        self._db: sqlite3.Connection | None = None
        self._read_db: sqlite3.Connection | None = None

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        if self._executor is None:
            raise StoreError("the SQLite store is not open")
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def _run_read(self, fn: Callable[..., T], *args: Any) -> T:
        if self._reader is None:
            raise StoreError("the SQLite store is not open")
        return await asyncio.get_running_loop().run_in_executor(self._reader, fn, *args)

    # --- life cycle -----------------------------------------------------------------------------

    async def open(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="response-store")
        self._reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="response-store-reader")
        try:
            await self._run(self._open)
            await self._run_read(self._open_reader)
        except (OSError, sqlite3.Error) as exc:
            await self.close()
            raise StoreError(f"store.path: cannot use SQLite file {self.path}: {exc}") from exc

    def _open(self) -> None:
        _in_the_background()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Autocommit mode; save() opens its own transaction. busy_timeout: wait out another process's write.
        db = sqlite3.connect(self.path, isolation_level=None, timeout=BUSY_TIMEOUT_SECONDS)
        _switch_to_wal(db)
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute("PRAGMA foreign_keys=ON")  # pruning a response drops its item rows
        db.executescript(_SCHEMA)
        columns = {row[1] for row in db.execute("PRAGMA table_info(responses)")}
        if "events" not in columns:  # a file made before background responses
            db.execute("ALTER TABLE responses ADD COLUMN events BLOB")
        # A file made before the count (or just made): counted once, under the write lock, so a row another
        # process adds meanwhile is counted either by its trigger or here, never twice.
        db.execute("BEGIN IMMEDIATE")
        try:
            if db.execute("SELECT n FROM response_count").fetchone() is None:
                db.execute("INSERT INTO response_count (n) SELECT COUNT(*) FROM responses")
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        self._db = db

    def _open_reader(self) -> None:
        db = sqlite3.connect(self.path, isolation_level=None, timeout=BUSY_TIMEOUT_SECONDS)
        db.execute("PRAGMA foreign_keys=ON")
        self._read_db = db

    async def flush(self) -> None:
        pass  # every save is committed before it returns

    async def close(self) -> None:
        if self._reader is not None:
            await self._run_read(self._close_reader)
            self._reader.shutdown(wait=True)
            self._reader = None
        if self._executor is not None:
            await self._run(self._close)
            self._executor.shutdown(wait=True)
            self._executor = None

    def _close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    def _close_reader(self) -> None:
        if self._read_db is not None:
            self._read_db.close()
            self._read_db = None

    @property
    def _conn(self) -> sqlite3.Connection:
        assert self._db is not None, "used before open()"
        return self._db

    @property
    def _read_conn(self) -> sqlite3.Connection:
        assert self._read_db is not None, "used before open()"
        return self._read_db

    # --- operations (each runs on the worker thread) ----------------------------------------------

    async def save(self, response: dict[str, Any], input_items: list[Item], events: bytes | None = None, *,
                   durable: bool = False, lists: Sequence[LogprobList] = ()) -> None:
        """Save and commit one Response now (the gateway saves through store.writer's queue instead)."""
        # Encoded here, on the loop, so the handler's dicts are never read from another thread.
        await self.write_batch([Write.encoding(response, input_items, events, lists)])

    async def write_batch(self, writes: list[Write]) -> None:
        """All the writes (encoded already: Write.encoding) in one transaction (group commit)."""
        await self._run(self._save_writes, writes)

    def _save_writes(self, writes: list[Write]) -> None:
        # Deflated here, in the writer thread (encoded already: no dict is read here), then committed.
        self._save([(w.response_id, *w.packed(), w.keys) for w in writes])

    def _save(self, rows: list[tuple[str, bytes, bytes, bytes | None, list[str]]]) -> None:
        now = self._clock()
        db = self._conn
        db.execute("BEGIN IMMEDIATE")
        try:
            for response_id, response, input_items, events, keys in rows:
                row = (response_id, now, response, input_items, events)
                if db.execute(_INSERT_NEW, row).rowcount == 0:  # saved before (a background response's status)
                    # Deleted, then inserted: REPLACE's implicit delete is not a DELETE for the item rows' cascade.
                    db.execute("DELETE FROM responses WHERE id = ?", (response_id,))
                    db.execute(_INSERT_NEW, row)
                db.executemany("INSERT OR REPLACE INTO items (key, response_id) VALUES (?, ?)",
                               [(key, response_id) for key in keys])
            db.execute("DELETE FROM responses WHERE saved_at < ?", (now - self.ttl_seconds,))
            # Everything older than the newest max_responses rows: the oldest rows past the count.
            (count,) = db.execute("SELECT n FROM response_count").fetchone()
            if count > self.max_responses:
                db.execute("DELETE FROM responses WHERE seq IN (SELECT seq FROM responses ORDER BY seq LIMIT ?)",
                           (count - self.max_responses,))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def _read(self, column: str, response_id: str) -> Any:
        row = self._read_conn.execute(f"SELECT {column} FROM responses WHERE id = ? AND saved_at >= ?",
                                 (response_id, self._clock() - self.ttl_seconds)).fetchone()
        return None if row is None or row[0] is None else codec.decode(row[0])

    async def get(self, response_id: str) -> dict[str, Any] | None:
        return await self._run_read(self._read, "response", response_id)

    async def input_items(self, response_id: str) -> list[Item] | None:
        return await self._run_read(self._read, "input_items", response_id)

    async def events(self, response_id: str) -> list[dict[str, Any]] | None:
        return await self._run_read(self._read, "events", response_id)

    async def delete(self, response_id: str) -> bool:
        return await self._run(self._delete, response_id)

    async def item_owner(self, item_key: str) -> str | None:
        return await self._run_read(self._item_owner, item_key)

    def _item_owner(self, item_key: str) -> str | None:
        row = self._read_conn.execute("SELECT items.response_id FROM items JOIN responses ON responses.id = "
                                 "items.response_id WHERE items.key = ? AND responses.saved_at >= ?",
                                 (item_key, self._clock() - self.ttl_seconds)).fetchone()
        return None if row is None else row[0]

    def _delete(self, response_id: str) -> bool:
        return self._conn.execute("DELETE FROM responses WHERE id = ?", (response_id,)).rowcount > 0
