"""A store in a PostgreSQL database: replicas on any machines share it (psycopg 3).

Its tables are named ``sklocus_*``, so the database may hold others. An append
takes a transaction-level advisory lock (:data:`_WRITE_KEY`) before it numbers
its entries, and commits before the lock is released: ids are given, and made
visible, in one order, with no gaps. The lease is a session-level advisory lock
(:data:`_LEASE_KEY`) held by a connection of its own, on which the snapshots
are written: it ends when that session does (the process killed, the
connection cut, the server restarted), and a snapshot written by a session
that lost it fails rather than overwrite the new holder's.

A connection that fails is dropped; the next call connects again, so a store
whose server was restarted or unreachable for a while serves again once the
server answers.
"""

from __future__ import annotations

import hashlib
import json
import threading

from sklocus.serve._store import (
    COLUMNS,
    SNAPSHOTS_KEPT,
    LeaseLost,
    Snapshot,
    Store,
    StoreError,
    StoreUnavailable,
    entry,
    redacted,
    sha256,
    snapshot_of,
)

# Seconds to wait for the server to accept a connection.
CONNECT_SECONDS = 5

_FORMAT = "sklocus store 1"


def _key(name):
    """Return a 64-bit advisory lock key of its own for ``name``."""
    return int.from_bytes(
        hashlib.sha256(name.encode()).digest()[:8], "big", signed=True
    )


_SCHEMA_KEY = _key("sklocus.store.schema")
_WRITE_KEY = _key("sklocus.store.write")
_LEASE_KEY = _key("sklocus.store.lease")

_SCHEMA = [
    "CREATE TABLE IF NOT EXISTS sklocus_about ("
    "name TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "INSERT INTO sklocus_about (name, value) VALUES ('format', %s) "
    "ON CONFLICT (name) DO NOTHING",
    "CREATE TABLE IF NOT EXISTS sklocus_log ("
    "id BIGINT PRIMARY KEY, kind TEXT NOT NULL, model TEXT, query TEXT, "
    "score DOUBLE PRECISION, query_group TEXT, body TEXT, request_key TEXT)",
    "CREATE UNIQUE INDEX IF NOT EXISTS sklocus_log_request_key "
    "ON sklocus_log (request_key) WHERE request_key IS NOT NULL",
    "CREATE TABLE IF NOT EXISTS sklocus_snapshots ("
    "through BIGINT PRIMARY KEY, sha256 TEXT NOT NULL, content BYTEA NOT NULL, "
    "state TEXT NOT NULL DEFAULT '{}', "
    "written_at TIMESTAMPTZ NOT NULL DEFAULT now())",
]


def _psycopg():
    try:
        import psycopg
    except ImportError as error:
        raise ImportError(
            "a PostgreSQL store needs psycopg 3: pip install 'sklocus[postgresql]'"
        ) from error
    return psycopg


class PostgreSQLStore(Store):
    """The store in a PostgreSQL database, its tables created when missing.

    Parameters
    ----------
    location : str
        A libpq connection URI (``postgresql://user:password@host:port/db``)
        or ``key=value`` string. The password never appears in
        :attr:`location`, messages or logs.
    """

    def __init__(self, location):
        self._psycopg = _psycopg()
        self._conninfo = str(location)
        self.location = redacted(location)
        self._lock = threading.Lock()
        self._connection = None
        self._lease_lock = threading.Lock()
        self._lease = None  # the connection whose session holds the lease
        self._candidate = None  # the connection that tries to take it
        with self._lock:
            connection = self._connected()
            try:
                with connection.transaction():
                    connection.execute(
                        "SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_KEY,)
                    )
                    for statement in _SCHEMA:
                        parameters = (_FORMAT,) if "%s" in statement else None
                        connection.execute(statement, parameters)
                    found = connection.execute(
                        "SELECT value FROM sklocus_about WHERE name = 'format'"
                    ).fetchone()[0]
            except self._psycopg.Error as error:
                raise self._failure(error, "cannot be prepared") from None
        if found != _FORMAT:
            raise StoreError(
                f"the store {self.location} has another layout ({found!r}); this "
                f"sklocus reads {_FORMAT!r}"
            )

    # -- connections ------------------------------------------------------------

    def _connect(self):
        try:
            return self._psycopg.connect(
                self._conninfo,
                autocommit=True,
                connect_timeout=CONNECT_SECONDS,
                application_name="sklocus",
            )
        except self._psycopg.Error as error:
            raise self._failure(error, "cannot be reached") from None

    def _connected(self):
        """Return the shared connection (holding ``_lock``), remade if it failed."""
        if self._connection is None or self._connection.closed:
            self._connection = self._connect()
        return self._connection

    def _failure(self, error, what):
        """Return the StoreError of a psycopg ``error``; drop a failed connection."""
        message = str(error).strip().replace(self._conninfo, self.location)
        if isinstance(error, self._psycopg.OperationalError):
            if self._connection is not None and self._connection.broken:
                self._connection = None
            return StoreUnavailable(f"the store {self.location} {what}: {message}")
        return StoreError(f"the store {self.location} {what}: {message}")

    def _run(self, work, what="cannot be read"):
        """``work(connection)`` on the shared connection, failures as StoreErrors."""
        with self._lock:
            connection = self._connected()
            try:
                return work(connection)
            except self._psycopg.Error as error:
                raise self._failure(error, what) from None

    # -- the log ----------------------------------------------------------------

    def append(self, entries, key=None):
        rows = [entry.columns() for entry in entries]
        if not rows:
            return self.last_id()

        def append(connection):
            with connection.transaction():
                connection.execute("SELECT pg_advisory_xact_lock(%s)", (_WRITE_KEY,))
                if key is not None:
                    done = connection.execute(
                        "SELECT id FROM sklocus_log WHERE request_key = %s", (key,)
                    ).fetchone()
                    if done is not None:
                        return int(done[0])
                start = connection.execute(
                    "SELECT coalesce(max(id), 0) FROM sklocus_log"
                ).fetchone()[0]
                keys = [None] * (len(rows) - 1) + [key]
                with connection.cursor() as cursor:
                    with cursor.copy(
                        f"COPY sklocus_log (id, {', '.join(COLUMNS)}, request_key) "
                        "FROM STDIN"
                    ) as copy:
                        for i, (row, request_key) in enumerate(zip(rows, keys)):
                            copy.write_row((start + 1 + i, *row, request_key))
            return start + len(rows)

        return self._run(append, "cannot be written")

    def entries_after(self, after, limit):
        rows = self._run(
            lambda connection: connection.execute(
                f"SELECT id, {', '.join(COLUMNS)} FROM sklocus_log WHERE id > %s "
                "ORDER BY id LIMIT %s",
                (after, limit),
            ).fetchall()
        )
        return [entry(row) for row in rows]

    def last_id(self):
        return int(
            self._run(
                lambda connection: connection.execute(
                    "SELECT coalesce(max(id), 0) FROM sklocus_log"
                ).fetchone()[0]
            )
        )

    # -- snapshots --------------------------------------------------------------

    def latest_snapshot(self):
        row = self._run(
            lambda connection: connection.execute(
                "SELECT through, sha256, content, state FROM sklocus_snapshots "
                "ORDER BY through DESC LIMIT 1"
            ).fetchone()
        )
        if row is None:
            return None
        return snapshot_of(row)

    def save_snapshot(self, content, through, state=None):
        snapshot = Snapshot(int(through), sha256(content), bytes(content), state or {})
        with self._lease_lock:
            if self._lease is None:
                raise LeaseLost(
                    f"the store {self.location}: a snapshot is written by the "
                    "lease's holder, and this replica does not hold it"
                )
            try:
                with self._lease.transaction():
                    self._lease.execute(
                        "INSERT INTO sklocus_snapshots (through, sha256, content, "
                        "state) VALUES (%s, %s, %s, %s) ON CONFLICT (through) "
                        "DO UPDATE SET sha256 = excluded.sha256, "
                        "content = excluded.content, state = excluded.state, "
                        "written_at = now()",
                        (
                            snapshot.through,
                            snapshot.sha256,
                            snapshot.content,
                            json.dumps(snapshot.state),
                        ),
                    )
                    self._lease.execute(
                        "DELETE FROM sklocus_snapshots WHERE through NOT IN (SELECT "
                        "through FROM sklocus_snapshots ORDER BY through DESC "
                        "LIMIT %s)",
                        (SNAPSHOTS_KEPT,),
                    )
            except self._psycopg.Error as error:
                lost = self._lease.broken
                if lost:  # the session, and so the lease, is gone
                    self._lease = None
                raise self._failure(error, "cannot keep the snapshot") from None
        return snapshot

    def seed_snapshot(self, content):
        def seed(connection):
            with connection.transaction():
                connection.execute("SELECT pg_advisory_xact_lock(%s)", (_WRITE_KEY,))
                if (
                    connection.execute(
                        "SELECT 1 FROM sklocus_snapshots LIMIT 1"
                    ).fetchone()
                    is None
                ):
                    connection.execute(
                        "INSERT INTO sklocus_snapshots (through, sha256, content) "
                        "VALUES (0, %s, %s)",
                        (sha256(content), bytes(content)),
                    )

        self._run(seed, "cannot keep the snapshot")
        return self.latest_snapshot()

    # -- the lease --------------------------------------------------------------

    def try_lease(self):
        with self._lease_lock:
            if self._lease is not None:
                try:  # still the same session, so still the lock's holder?
                    self._lease.execute("SELECT 1")
                    return True
                except self._psycopg.Error:
                    self._lease.close()
                    self._lease = None
            # Tried on a session kept for it: a replica that tries at each
            # reading of the log would otherwise open a connection (a server
            # process) each time.
            if self._candidate is None or self._candidate.closed:
                self._candidate = self._connect()
            try:
                held = self._candidate.execute(
                    "SELECT pg_try_advisory_lock(%s)", (_LEASE_KEY,)
                ).fetchone()[0]
            except self._psycopg.Error as error:
                self._candidate.close()
                self._candidate = None
                raise self._failure(error, "cannot be leased") from None
            if not held:
                return False
            self._lease, self._candidate = self._candidate, None
            return True

    @property
    def holds_lease(self):
        lease = self._lease
        return lease is not None and not lease.closed

    def release_lease(self):
        with self._lease_lock:
            if self._lease is not None:
                # Unlocked before the session is closed: a closed session's lock
                # is freed when its server process exits, a moment after close()
                # returns, so another replica trying at once would not get it.
                try:
                    self._lease.execute("SELECT pg_advisory_unlock(%s)", (_LEASE_KEY,))
                except self._psycopg.Error:
                    pass  # the session is gone, and its lock with it
            for connection in (self._lease, self._candidate):
                if connection is not None:
                    connection.close()  # the session ends, and any lock with it
            self._lease = self._candidate = None

    def close(self):
        self.release_lease()
        with self._lock:
            if self._connection is not None:
                self._connection.close()
                self._connection = None
