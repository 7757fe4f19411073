"""A store in one SQLite file: for one machine, one process or several.

The file is in write-ahead-log mode with ``synchronous=FULL``: an append is on
disk when it returns, and readers never wait for a writer. Writers take turns
(``BEGIN IMMEDIATE``, waiting up to :data:`BUSY_SECONDS` for one another). The
lease is an exclusive ``flock`` on a file beside the store (``STORE-lease``),
which the kernel releases when the process holding it ends, however it ends.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sqlite3
import threading
from pathlib import Path

from sklocus.serve._journal import roll_back
from sklocus.serve._private_files import PrivateFileError, create_private
from sklocus.serve._store import (
    COLUMNS,
    SNAPSHOTS_KEPT,
    LeaseLost,
    Snapshot,
    Store,
    StoreError,
    StoreUnavailable,
    entry,
    sha256,
    snapshot_of,
)

# How long a write waits for another process's write before giving up.
BUSY_SECONDS = 30.0

# Says the file is a store, and which layout it has.
_FORMAT = "sklocus store 1"

_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS about (name TEXT PRIMARY KEY, value TEXT NOT NULL);
INSERT OR IGNORE INTO about (name, value) VALUES ('format', '{_FORMAT}');
CREATE TABLE IF NOT EXISTS log (
    id INTEGER PRIMARY KEY,
    kind TEXT NOT NULL,
    model TEXT,
    query TEXT,
    score REAL,
    query_group TEXT,
    body TEXT,
    request_key TEXT
);
CREATE UNIQUE INDEX IF NOT EXISTS log_request_key ON log (request_key)
    WHERE request_key IS NOT NULL;
CREATE TABLE IF NOT EXISTS snapshots (
    through INTEGER PRIMARY KEY,
    sha256 TEXT NOT NULL,
    content BLOB NOT NULL,
    state TEXT NOT NULL DEFAULT '{{}}'
);
"""


class SQLiteStore(Store):
    """The store in a SQLite file, created (owner-only) when missing.

    Parameters
    ----------
    path : str or path-like
    """

    def __init__(self, path):
        self.path = Path(path)
        self.location = str(self.path)
        if self.path.is_dir():
            raise StoreError(f"{self.path} is a folder, not a store")
        try:
            create_private(self.path, "store")
        except PrivateFileError as error:
            raise StoreError(str(error)) from None
        self._lock = threading.Lock()
        self._lease = None  # the lease file's descriptor, while held
        try:
            self._db = sqlite3.connect(
                self.path,
                timeout=BUSY_SECONDS,
                check_same_thread=False,
                isolation_level=None,
            )
            tables = {
                row[0]
                for row in self._db.execute(
                    "SELECT name FROM sqlite_master WHERE type = 'table'"
                )
            }
            if tables and "about" not in tables:
                what = "a feedback journal" if "outcomes" in tables else "a database"
                raise StoreError(
                    f"{self.path} is {what} of other tables, not a store; give a "
                    "new file, or the store's own"
                )
            mode = self._db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(_SCHEMA)
            found = self._db.execute(
                "SELECT value FROM about WHERE name = 'format'"
            ).fetchone()
        except sqlite3.DatabaseError as error:
            raise StoreError(
                f"{self.path} is not a store sklocus can open: {error}"
            ) from None
        if mode.lower() != "wal":
            raise StoreError(f"{self.path} cannot be put in WAL mode (got {mode})")
        if found is None or found[0] != _FORMAT:
            raise StoreError(
                f"{self.path} is a store of another layout ({found and found[0]!r}); "
                f"this sklocus reads {_FORMAT!r}"
            )

    def _unavailable(self, error):
        return StoreUnavailable(f"the store {self.location} cannot be used: {error}")

    @contextlib.contextmanager
    def _writing(self):
        """Yield the database in a write transaction, committed on leaving.

        Writers of other processes are waited for up to BUSY_SECONDS; a write
        that fails (a full disk, a lock held too long) is rolled back whole
        and raised as StoreUnavailable.
        """
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    yield self._db
                    self._db.execute("COMMIT")
                except BaseException:
                    roll_back(self._db)
                    raise
            except sqlite3.OperationalError as error:
                raise self._unavailable(error) from None

    def append(self, entries, key=None):
        rows = [entry.columns() for entry in entries]
        if not rows:
            return self.last_id()
        with self._writing() as db:
            if key is not None:
                done = db.execute(
                    "SELECT id FROM log WHERE request_key = ?", (key,)
                ).fetchone()
                if done is not None:
                    return int(done[0])
            start = db.execute("SELECT coalesce(max(id), 0) FROM log").fetchone()[0]
            keys = [None] * (len(rows) - 1) + [key]
            db.executemany(
                f"INSERT INTO log (id, {', '.join(COLUMNS)}, request_key) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (start + 1 + i, *row, request_key)
                    for i, (row, request_key) in enumerate(zip(rows, keys))
                ],
            )
        return start + len(rows)

    def _read(self, sql, parameters=()):
        with self._lock:
            try:
                return self._db.execute(sql, parameters).fetchall()
            except sqlite3.OperationalError as error:
                raise self._unavailable(error) from None

    def entries_after(self, after, limit):
        rows = self._read(
            f"SELECT id, {', '.join(COLUMNS)} FROM log WHERE id > ? ORDER BY id "
            "LIMIT ?",
            (after, limit),
        )
        return [entry(row) for row in rows]

    def last_id(self):
        return int(self._read("SELECT coalesce(max(id), 0) FROM log")[0][0])

    def latest_snapshot(self):
        rows = self._read(
            "SELECT through, sha256, content, state FROM snapshots "
            "ORDER BY through DESC LIMIT 1"
        )
        if not rows:
            return None
        return snapshot_of(rows[0])

    def save_snapshot(self, content, through, state=None):
        if not self.holds_lease:
            raise LeaseLost(
                f"the store {self.location}: a snapshot is written by the lease's "
                "holder, and this replica does not hold it"
            )
        snapshot = Snapshot(int(through), sha256(content), bytes(content), state or {})
        with self._writing() as db:
            db.execute(
                "INSERT OR REPLACE INTO snapshots (through, sha256, content, "
                "state) VALUES (?, ?, ?, ?)",
                (
                    snapshot.through,
                    snapshot.sha256,
                    snapshot.content,
                    json.dumps(snapshot.state),
                ),
            )
            db.execute(
                "DELETE FROM snapshots WHERE through NOT IN (SELECT through "
                "FROM snapshots ORDER BY through DESC LIMIT ?)",
                (SNAPSHOTS_KEPT,),
            )
        return snapshot

    def seed_snapshot(self, content):
        with self._writing() as db:
            if db.execute("SELECT 1 FROM snapshots").fetchone() is None:
                db.execute(
                    "INSERT INTO snapshots (through, sha256, content) VALUES (0, ?, ?)",
                    (sha256(content), bytes(content)),
                )
        return self.latest_snapshot()

    @property
    def lease_path(self):
        """The file whose lock is the lease."""
        return Path(f"{self.path}-lease")

    def try_lease(self):
        with self._lock:
            if self._lease is not None:
                return True
            try:
                descriptor = os.open(
                    self.lease_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600
                )
            except OSError as error:
                raise StoreError(
                    f"{self.lease_path}: cannot open the store's lease ({error})"
                ) from None
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(descriptor)
                return False
            self._lease = descriptor
            return True

    @property
    def holds_lease(self):
        return self._lease is not None

    def release_lease(self):
        with self._lock:
            if self._lease is not None:
                os.close(self._lease)  # which unlocks it
                self._lease = None

    def close(self):
        self.release_lease()
        with self._lock:
            self._db.close()
