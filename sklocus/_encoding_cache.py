"""The caches of :class:`~sklocus.encoders.SentenceEncoder`'s encodings.

Three levels: the encodings of the texts used last, in memory; those of the
shipped data sets' questions, packaged with sklocus; and every encoding in one
SQLite file of a folder, shared across processes and sessions. Each maps a text
to its float32 vector; none encodes anything.
"""

from __future__ import annotations

import functools
import hashlib
import os
import sqlite3
import sys
import threading
from pathlib import Path

import numpy as np
from cachetools import LRUCache

from sklocus._shipped import SHIPPED, SHIPPED_ENCODINGS, shipped_folder

# The on-disk cache: its file in the folder, and the texts looked up per query.
DISK_FILE_NAME = "sklocus-encodings.sqlite3"
_DISK_LOOKUP_CHUNK = 500
# What reading or writing the on-disk cache may raise: the folder or the file
# out of reach, a full disk, a file that is not SQLite.
CACHE_ERRORS = (OSError, sqlite3.Error)


def _entry_bytes(entry):
    """Bytes an in-memory ``(text, vector)`` entry holds: the objects and the pair."""
    text, vector = entry
    return sys.getsizeof(entry) + sys.getsizeof(text) + sys.getsizeof(vector)


class MemoryCache:
    """Encodings of the texts used last, bounded in bytes and in texts; thread-safe.

    A ``cachetools.LRUCache`` whose size is bytes (text, vector and the pair of
    them), under a lock; past ``max_texts`` texts it drops the least recently used
    too.

    Parameters
    ----------
    max_texts : int
        Most texts held.
    max_bytes : int
        Most bytes held, texts included.
    """

    def __init__(self, max_texts, max_bytes):
        self._entries = LRUCache(maxsize=max_bytes, getsizeof=_entry_bytes)
        self._max_texts = max_texts
        self._lock = threading.Lock()

    def __len__(self):
        return len(self._entries)

    def __contains__(self, text):
        return text in self._entries

    @property
    def nbytes(self):
        """Bytes the cache counts its entries to hold (at most ``max_bytes``)."""
        return self._entries.currsize

    def lookup(self, texts):
        """Return ``{text: vector}`` of the ``texts`` found, now the most recent."""
        found = {}
        with self._lock:
            for text in texts:
                entry = self._entries.get(text)
                if entry is not None:
                    found[text] = entry[1]
        return found

    def store(self, vectors):
        """Keep ``{text: vector}``, dropping the least recently used as needed."""
        with self._lock:
            for text, vector in vectors.items():
                if text in self._entries:
                    continue
                # A copy: a row of a batch's array would keep it all.
                entry = (text, np.array(vector, dtype=np.float32))
                # A text too large for the whole cache is not kept, rather than
                # emptying the cache for it.
                if self._entries.getsizeof(entry) <= self._entries.maxsize:
                    self._entries[text] = entry
            while len(self._entries) > self._max_texts:
                self._entries.popitem()


def folder_problem(folder):
    """Say why ``folder`` cannot hold the on-disk cache, or return None.

    Creates nothing: a folder yet to be made is judged by its nearest existing
    parent, so that a command can refuse a bad folder before any work, and
    leaves no file behind when it encodes nothing.

    Parameters
    ----------
    folder : str or path-like

    Returns
    -------
    str or None
    """
    folder = Path(folder).expanduser()
    file = folder / DISK_FILE_NAME
    if file.exists():
        if not file.is_file():
            return f"{file} is not a file"
        if not os.access(file, os.R_OK | os.W_OK):
            return f"{file} cannot be read and written"
    existing = folder
    while not existing.exists():
        if existing.parent == existing:
            break
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is not a folder"
    # SQLite writes a journal beside its file, so the folder must be writable.
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing} is not writable"
    return None


class DiskCache:
    """Encodings in one SQLite file of ``folder``, keyed by model name and text.

    A row is ``(model, text_sha256, vector)``: the model's name as given, the
    SHA-256 of the UTF-8 text, and the float32 vector's bytes. Each call opens its
    own connection, so the cache serves threads and processes alike.

    Parameters
    ----------
    folder : str or path-like
        Created if missing.
    model : str or path-like
        The model whose encodings to read and write.
    """

    def __init__(self, folder, model):
        self.folder = folder
        self.model = os.fspath(model)

    def path(self):
        """Return the path of the SQLite file, creating its folder if missing."""
        folder = Path(self.folder).expanduser()
        folder.mkdir(parents=True, exist_ok=True)
        return folder / DISK_FILE_NAME

    def _connect(self):
        connection = sqlite3.connect(self.path(), timeout=60)
        connection.execute(
            "CREATE TABLE IF NOT EXISTS encodings (model TEXT, text_sha256 TEXT, "
            "vector BLOB, PRIMARY KEY (model, text_sha256))"
        )
        return connection

    @staticmethod
    def _digest(text):
        return hashlib.sha256(text.encode("utf-8")).hexdigest()

    def lookup(self, texts):
        """Return ``{text: vector}`` of the ``texts`` found on disk."""
        found = {}
        by_digest = {self._digest(text): text for text in texts}
        digests = list(by_digest)
        with self._connect() as connection:
            for start in range(0, len(digests), _DISK_LOOKUP_CHUNK):
                chunk = digests[start : start + _DISK_LOOKUP_CHUNK]
                rows = connection.execute(
                    "SELECT text_sha256, vector FROM encodings WHERE model = ? AND "
                    f"text_sha256 IN ({','.join('?' * len(chunk))})",
                    [self.model, *chunk],
                )
                for digest, blob in rows:
                    found[by_digest[digest]] = np.frombuffer(blob, dtype=np.float32)
        return found

    def store(self, vectors):
        """Write ``{text: vector}``, replacing what the file held for those texts."""
        rows = [
            (self.model, self._digest(text), np.asarray(vector, np.float32).tobytes())
            for text, vector in vectors.items()
        ]
        with self._connect() as connection:
            connection.executemany(
                "INSERT OR REPLACE INTO encodings VALUES (?, ?, ?)", rows
            )


class ShippedEncodings:
    """Encodings that ship inside the package, read-only: ``{text: vector}``.

    A shipped data folder (:mod:`sklocus._shipped`) may hold, beside its
    ``queries.parquet``, what a packaged sentence encoder makes of each ``query``
    text, row by row, as ``encoded_<model>.npy`` (float32), for the models of
    :data:`~sklocus._shipped.SHIPPED_ENCODINGS`. They are that model's
    own output, kept so that the texts of the shipped data need not be encoded on
    each machine; loaded on first use, once per process.

    Parameters
    ----------
    model : str
        The sentence-transformers name (``"all-MiniLM-L6-v2"``, with or without
        its ``sentence-transformers/`` prefix). Other models, and local folders,
        have none.
    """

    def __init__(self, model):
        self.model = os.fspath(model).removeprefix("sentence-transformers/")

    def lookup(self, texts):
        """Return ``{text: vector}`` of the ``texts`` that ship encoded."""
        row_of, vectors = _shipped_table(self.model)
        if not row_of:
            return {}
        return {text: vectors[row_of[text]] for text in texts if text in row_of}


@functools.cache
def _shipped_table(model):
    """Return ``({text: row}, vectors)``: every shipped question ``model`` encoded."""
    import pyarrow.parquet as pq

    row_of, tables = {}, []
    for name in SHIPPED if model in SHIPPED_ENCODINGS else ():
        folder = shipped_folder(name)
        path = folder / f"encoded_{model}.npy"
        if not path.is_file():
            continue
        vectors = np.load(path, allow_pickle=False)
        texts = pq.read_table(folder / "queries.parquet", columns=["query"])
        texts = texts.column("query").to_pylist()
        if vectors.dtype != np.float32 or vectors.shape[0] != len(texts):
            raise RuntimeError(
                f"{path} should hold one float32 row per query of "
                f"{folder / 'queries.parquet'} ({len(texts)}), not an array of "
                f"{vectors.dtype} and shape {vectors.shape}; reinstall sklocus"
            )
        offset = sum(len(table) for table in tables)
        for row, text in enumerate(texts):
            row_of.setdefault(text, offset + row)
        tables.append(vectors)
    if not tables:
        return {}, np.zeros((0, 0), np.float32)
    return row_of, np.concatenate(tables)
