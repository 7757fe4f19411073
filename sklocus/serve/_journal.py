"""The outcomes a served router was sent, kept in SQLite until they are learnt.

``POST /feedback`` answers only once its outcomes are in the journal: a SQLite
database in write-ahead-log mode with ``synchronous=FULL``, so a committed
batch is on disk (the log is flushed with fsync at each commit) and survives a
crash of the process or the machine. Each outcome gets an increasing id.

Outcomes are folded into the served router in batches. With ``--write-back``
the model file then holds them, and the journal records up to which id: before
the file is replaced, the id and the SHA-256 of the new file are recorded as
*pending*; after, as *folded*. A crash between the two leaves a pending record
that the next start settles by hashing the model file: the new file means the
outcomes are in it, the old one that they are not. Without write-back the model
file never holds them, and every outcome is learnt again at each start.

A journal belongs to one model file: one whose outcomes were folded into
another file (its hash differs from the one recorded) is refused at start.
"""

from __future__ import annotations

import hashlib
import sqlite3
import threading
from pathlib import Path

from sklocus.serve._private_files import PrivateFileError, create_private

_SCHEMA = """
CREATE TABLE IF NOT EXISTS outcomes (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    query TEXT NOT NULL,
    model TEXT NOT NULL,
    score REAL NOT NULL,
    query_group TEXT
);
CREATE TABLE IF NOT EXISTS marks (
    name TEXT PRIMARY KEY,
    through INTEGER NOT NULL,
    sha256 TEXT
);
CREATE TABLE IF NOT EXISTS removals (
    model TEXT PRIMARY KEY,
    through INTEGER NOT NULL
);
"""


class JournalError(RuntimeError):
    """A journal that cannot serve the model file it was opened for."""


def roll_back(db):
    """Roll back the open transaction, if SQLite has not already.

    On some errors (a full disk) SQLite rolls back by itself, and a second
    rollback would raise, hiding the error that matters.
    """
    if db.in_transaction:
        try:
            db.execute("ROLLBACK")
        except sqlite3.Error:
            pass


def file_digest(path):
    """SHA-256 of a file's bytes, in hex."""
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class FeedbackJournal:
    """Durable outcomes of a served router (see the module's docstring).

    Parameters
    ----------
    path : str or path-like
        The SQLite file, created when missing.

    Every method may be called from any thread; they take turns.
    """

    def __init__(self, path):
        self.path = Path(path)
        if self.path.is_dir():
            raise JournalError(f"{self.path} is a folder, not a feedback journal")
        self._lock = threading.Lock()
        try:
            create_private(self.path, "feedback journal")
        except PrivateFileError as error:
            raise JournalError(str(error)) from None
        try:
            self._db = sqlite3.connect(
                self.path, check_same_thread=False, isolation_level=None
            )
            mode = self._db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(_SCHEMA)
        except sqlite3.DatabaseError as error:
            raise JournalError(
                f"{self.path} is not a feedback journal sklocus can open: {error}"
            ) from None
        if mode.lower() != "wal":
            raise JournalError(f"{self.path} cannot be put in WAL mode (got {mode})")

    def close(self):
        with self._lock:
            self._db.close()

    def append(self, outcomes):
        """Record ``(query, model, score, group)`` rows; return the last id.

        Returns once the rows are committed, which with ``synchronous=FULL``
        means on disk.
        """
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.executemany(
                    "INSERT INTO outcomes (query, model, score, query_group) "
                    "VALUES (?, ?, ?, ?)",
                    outcomes,
                )
                last = self._db.execute("SELECT max(id) FROM outcomes").fetchone()[0]
                self._db.execute("COMMIT")
            except BaseException:
                roll_back(self._db)
                raise
        return int(last)

    def last_id(self):
        with self._lock:
            found = self._db.execute("SELECT max(id) FROM outcomes").fetchone()[0]
        return int(found or 0)

    def counts_through(self, through):
        """How many outcomes each model has among those with ids up to ``through``.

        Returns ``{model: count}``, for the models that have any. Outcomes of
        a removed model stay its own: a model served later under its name
        counts only those journalled after the removal.
        """
        with self._lock:
            rows = self._db.execute(
                "SELECT o.model, count(*) FROM outcomes AS o "
                "LEFT JOIN removals AS r ON r.model = o.model "
                "WHERE o.id <= ? AND o.id > coalesce(r.through, 0) "
                "GROUP BY o.model",
                (through,),
            ).fetchall()
        return dict(rows)

    def since(self, after, limit):
        """Up to ``limit`` outcomes with ids above ``after``, oldest first.

        Rows ``(id, query, model, score, group)``.
        """
        with self._lock:
            return self._db.execute(
                "SELECT id, query, model, score, query_group FROM outcomes "
                "WHERE id > ? ORDER BY id LIMIT ?",
                (after, limit),
            ).fetchall()

    def record_removal(self, model):
        """Note that ``model`` stopped being served now.

        The outcomes journalled for it so far are its own: a model onboarded
        later under the same name never learns them.
        """
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO removals (model, through) VALUES "
                "(?, (SELECT coalesce(max(id), 0) FROM outcomes))",
                (model,),
            )

    def removals(self):
        """Return ``{model: id}``: the last outcome of each removed name's model."""
        with self._lock:
            return dict(self._db.execute("SELECT model, through FROM removals"))

    def _mark(self, name):
        row = self._db.execute(
            "SELECT through, sha256 FROM marks WHERE name = ?", (name,)
        ).fetchone()
        return (0, None) if row is None else row

    def _set_mark(self, name, through, sha256):
        self._db.execute(
            "INSERT OR REPLACE INTO marks (name, through, sha256) VALUES (?, ?, ?)",
            (name, through, sha256),
        )

    def settle(self, model_path):
        """Return the id through which ``model_path`` holds the journal's outcomes.

        Settles a write-back that a crash interrupted (see the module's
        docstring), and refuses a model file other than the one the journal
        folded its outcomes into.
        """
        digest = file_digest(model_path)
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                folded, folded_sha = self._mark("folded")
                previous, previous_sha = self._mark("previous")
                pending, pending_sha = self._mark("pending")
                if pending_sha == digest:  # replaced, then the process died
                    folded, folded_sha = pending, digest
                    self._set_mark("folded", folded, digest)
                elif folded and folded_sha != digest and previous_sha == digest:
                    # The machine died before the rename reached the disk: the
                    # file is the one before, and so is what it holds.
                    folded, folded_sha = previous, digest
                    self._set_mark("folded", folded, digest)
                self._db.execute("DELETE FROM marks WHERE name = 'pending'")
                self._db.execute("COMMIT")
            except BaseException:
                roll_back(self._db)
                raise
        if folded and folded_sha != digest:
            raise JournalError(
                f"the feedback journal {self.path} folded its outcomes through "
                f"#{folded} into a model file other than {model_path} (its "
                "SHA-256 differs): serve that file with it, or start a new journal"
            )
        return folded

    def begin_fold(self, through, sha256):
        """Record that the model file of digest ``sha256`` will hold ``through``.

        That is, the outcomes with ids up to ``through``.
        """
        with self._lock:
            self._set_mark("pending", through, sha256)

    def end_fold(self, through, sha256):
        """Record that the model file now holds the outcomes up to ``through``."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                folded, folded_sha = self._mark("folded")
                if folded_sha is not None and folded_sha != sha256:
                    self._set_mark("previous", folded, folded_sha)
                self._set_mark("folded", through, sha256)
                self._db.execute("DELETE FROM marks WHERE name = 'pending'")
                self._db.execute("COMMIT")
            except BaseException:
                roll_back(self._db)
                raise

    def forget_folds(self):
        """Forget which outcomes any model file holds: all are learnt again.

        For a router built afresh (``sklocus serve EMBEDDER EVALS``), which holds
        none of the journal's outcomes.
        """
        with self._lock:
            self._db.execute("DELETE FROM marks")
