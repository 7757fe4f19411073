"""The store of a served router's changes: one ordered log, and its snapshots.

Several replicas of a served router (worker processes on one machine, or
servers on several machines) learn the same things by reading one store. It
holds

- the **log**: every change to the served router, with ids 1, 2, 3, ... in
  the order they were appended: an outcome sent to ``POST /feedback``, a model
  onboarded with its evaluations, a model removed, and *fold* marks, each the
  end of a batch of outcomes;
- the latest **snapshots**: a model file's bytes, the id of the last entry
  they hold, and their SHA-256.

Each replica folds the log in id order: the outcomes since the last mark in
one batch at each fold mark, a change at each onboarding or removal. Where a
batch ends is written in the log, not left to a replica's timing, so two
replicas that have folded through the same id did the same arithmetic and rank
every query alike. A replica that starts loads the latest snapshot and folds
the entries after it.

Ids are given and made visible in one order: an append takes the store's write
lock, numbers its entries after the largest id, and commits before the lock is
free, so a reader that sees an id has seen every id below it.

One replica at a time holds the store's **lease** (:meth:`Store.try_lease`):
it writes the fold marks and the snapshots. A lease ends with the process that
holds it (a PostgreSQL session's advisory lock; a lock on a file beside a SQLite
store), so a replica killed mid-snapshot leaves the previous snapshot whole
and another replica takes over.

Two backends keep this contract: :class:`~sklocus.serve._store._sqlite.SQLiteStore`
(one machine: one process, or several on one file) and
:class:`~sklocus.serve._store._postgresql.PostgreSQLStore` (replicas on any
machines, with psycopg 3). :func:`open_store` picks one from a location.
"""

from __future__ import annotations

import hashlib
import json
import re
import urllib.parse
from dataclasses import dataclass, field

__all__ = [
    "KINDS",
    "LogEntry",
    "Snapshot",
    "Store",
    "StoreError",
    "StoreUnavailable",
    "open_store",
    "redacted",
]

#: What a log entry records: an outcome, an onboarded model, a removed model,
#: or a fold mark (the end of a batch of outcomes).
KINDS = ("outcome", "model", "removal", "fold")

# Snapshots kept: the latest, and the one before for a reader that chose it
# just before the latest was written.
SNAPSHOTS_KEPT = 2


class StoreError(RuntimeError):
    """A store that cannot be opened, or that holds what sklocus did not write."""


class StoreUnavailable(StoreError):
    """The store cannot be reached or written now (its server is down, its disk full).

    Nothing of the operation that raised it was done; it may be tried again.
    """


class LeaseLost(StoreError):
    """A write that needs the lease, by a store that does not hold it."""


@dataclass(frozen=True)
class LogEntry:
    """One change of a served router, as the log keeps it.

    Attributes
    ----------
    kind : {"outcome", "model", "removal", "fold"}
    model : str or None
        The model an outcome, onboarding or removal names.
    query : str or None
        An outcome's query.
    score : float or None
        An outcome's score, in [0, 1].
    query_group : str or None
        An outcome's query group.
    body : str or None
        An onboarding's JSON: ``{"evaluations", "cost", "query_groups"}``.
    id : int
        Given by the store when the entry is appended (0 before).
    """

    kind: str
    model: str | None = None
    query: str | None = None
    score: float | None = None
    query_group: str | None = None
    body: str | None = None
    id: int = 0

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(
                f"a log entry's kind is one of {', '.join(KINDS)}; got {self.kind!r}"
            )

    @classmethod
    def outcome(cls, query, model, score, query_group=None):
        """Make the entry of an outcome: ``model`` scored ``score`` on ``query``."""
        return cls(
            "outcome",
            model=model,
            query=query,
            score=float(score),
            query_group=query_group,
        )

    def columns(self):
        """Return the columns after the id, in the order the backends keep them."""
        return (
            self.kind,
            self.model,
            self.query,
            self.score,
            self.query_group,
            self.body,
        )


#: The log's columns, in the order of :meth:`LogEntry.columns` after the id.
COLUMNS = ("kind", "model", "query", "score", "query_group", "body")


@dataclass(frozen=True)
class Snapshot:
    """A model file's bytes, and the id of the last log entry they hold.

    ``state`` is what a replica keeps beside the router, as JSON-ready data
    (how many outcomes each model has learnt).
    """

    through: int
    sha256: str
    content: bytes
    state: dict = field(default_factory=dict)

    def check(self):
        """Return the snapshot; raise StoreError when its bytes are not its hash's."""
        found = sha256(self.content)
        if found != self.sha256:
            raise StoreError(
                f"the snapshot through #{self.through} is damaged: its bytes hash "
                f"to {found[:12]}..., not the {self.sha256[:12]}... it was written "
                "with"
            )
        return self


def snapshot_of(row):
    """Make a checked Snapshot of a row ``(through, sha256, content, state)``."""
    through, digest, content, state = row
    try:
        state = json.loads(state)
    except (TypeError, ValueError):
        state = None
    if not isinstance(state, dict):
        raise StoreError(
            f"the snapshot through #{through} has a state that is not a JSON "
            "object: the store was written by something else than sklocus"
        )
    return Snapshot(int(through), digest, bytes(content), state).check()


def sha256(content):
    """SHA-256 of ``content``, in hex."""
    return hashlib.sha256(content).hexdigest()


class Store:
    """What every backend keeps and does (see the module's docstring).

    Every method may be called from any thread of the process.
    """

    #: Where the store is, with any password masked: safe to log or show.
    location = ""

    def append(self, entries, key=None):
        """Append ``entries`` (LogEntry) in order; return the last id given.

        Returns once they are committed: on disk (SQLite, ``synchronous=FULL``)
        or acknowledged by the PostgreSQL server. Raises StoreUnavailable when
        the store cannot be written.

        ``key``, a string the caller makes unique to one request (an
        idempotency key), makes the append happen once: when entries were
        appended with it before, nothing is appended and their last id is
        returned. A request retried after an answer that never came is then
        kept once, even where the first try was committed.
        """
        raise NotImplementedError

    def entries_after(self, after, limit):
        """Up to ``limit`` entries with ids above ``after``, in id order."""
        raise NotImplementedError

    def last_id(self):
        """Return the largest id in the log (0 when it is empty)."""
        raise NotImplementedError

    def latest_snapshot(self):
        """Return the latest snapshot, checked against its hash; None before any."""
        raise NotImplementedError

    def save_snapshot(self, content, through, state=None):
        """Keep ``content`` as the snapshot through id ``through``; return it.

        ``state``, JSON-ready data, is kept beside it (:class:`Snapshot`).

        Needs the lease (LeaseLost otherwise). Written in one transaction: a
        process killed meanwhile leaves the previous snapshot the latest. The
        snapshots before the last :data:`SNAPSHOTS_KEPT` are dropped.
        """
        raise NotImplementedError

    def seed_snapshot(self, content):
        """Keep ``content`` as the snapshot through id 0, unless there is one.

        How the first replica starts a store: replicas starting together each
        offer their model file, the first kept is every replica's start, and
        the latest snapshot is returned. Needs no lease.
        """
        raise NotImplementedError

    def try_lease(self):
        """Take the lease if no one holds it; return whether this store holds it."""
        raise NotImplementedError

    @property
    def holds_lease(self):
        """Whether this store holds the lease (as far as it last knew)."""
        raise NotImplementedError

    def release_lease(self):
        """Give the lease up, if held."""
        raise NotImplementedError

    def close(self):
        """Release the lease and close the connections; the store keeps its data."""
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    def __repr__(self):
        return f"{type(self).__name__}({self.location!r})"


def entry(row):
    """Make a LogEntry of a row: its id, then :data:`COLUMNS`."""
    id_, kind, model, query, score, group, body = row
    return LogEntry(kind, model, query, score, group, body, int(id_))


# A libpq connection string of settings: "host=db dbname=router user=sklocus".
_LIBPQ_SETTINGS = re.compile(
    r"^\s*(host|hostaddr|port|dbname|user|password|passfile|service|sslmode"
    r"|options|connect_timeout|application_name)\s*="
)


def _is_postgresql(location):
    return location.startswith(("postgresql://", "postgres://")) or bool(
        _LIBPQ_SETTINGS.match(location)
    )


def open_store(location):
    """Open the store at ``location``, creating its tables when missing.

    Parameters
    ----------
    location : str or path-like
        ``postgresql://user@host:port/database`` (or ``postgres://``, or a
        libpq ``key=value`` string) for PostgreSQL; a file path, or
        ``sqlite:///path``, for SQLite.

    Returns
    -------
    Store
    """
    location = str(location)
    if _is_postgresql(location):
        from sklocus.serve._store._postgresql import PostgreSQLStore

        return PostgreSQLStore(location)
    from sklocus.serve._store._sqlite import SQLiteStore

    if location.startswith("sqlite://"):
        location = location[len("sqlite://") :]
    return SQLiteStore(location)


_PASSWORD_SETTING = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)")


def redacted(location):
    """``location`` with its password, if any, replaced by ``***``."""
    location = str(location)
    if location.startswith(("postgresql://", "postgres://")):
        parts = urllib.parse.urlsplit(location)
        if parts.password is not None:
            user = parts.username or ""
            host = parts.netloc.rpartition("@")[2]
            parts = parts._replace(netloc=f"{user}:***@{host}")
        query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
        if any(key == "password" for key, _ in query):
            masked = [(k, "***" if k == "password" else v) for k, v in query]
            parts = parts._replace(query=urllib.parse.urlencode(masked, safe="*"))
        return urllib.parse.urlunsplit(parts)
    return _PASSWORD_SETTING.sub(r"\1***", location)
