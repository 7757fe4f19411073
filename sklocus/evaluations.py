"""Evaluation sets, the data model of sklocus.

One model's evaluations are a *mapping from query to score*: a ``dict`` or a pandas
``Series`` whose keys (or index) are queries, given as their text or any hashable id,
and whose values are scores in [0, 1] (usually 0/1 correctness). Many models are a
sequence of such mappings, one per model, in the spirit of
:class:`~sklearn.feature_extraction.DictVectorizer`'s list of dicts. The sets are
ragged: models need not share queries, and each may have any number of evaluations.

Every estimator in sklocus reads evaluation sets through :func:`check_evaluation_sets`,
so every one of them rejects bad input with the same messages.
"""

from __future__ import annotations

import hashlib
import numbers
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from sklearn.utils import check_random_state

from sklocus._sklearn_compat import Interval, validate_params
from sklocus._validation import as_item_list, shown

__all__ = [
    "RaggedEvaluations",
    "check_evaluation_sets",
    "from_long",
    "from_matrix",
    "subsample",
    "to_long",
    "to_matrix",
]

_DUPLICATE_RULES = ("error", "mean", "majority")
# Ragged input over at most this many (set, query) pairs beyond four per
# evaluation is checked for repeated queries by counting, not sorting.
_DENSE_PAIRS = 2**20


def query_sort_key(query):
    """Return a key that orders queries of any hashable kinds the same way."""
    return type(query).__name__, repr(query)


@dataclass(frozen=True, eq=False)
class RaggedEvaluations:
    """Validated evaluation sets, flattened into arrays for batching.

    Set ``i`` holds the evaluations ``offsets[i]:offsets[i + 1]`` of ``query_codes``
    and ``scores``, in the order the user gave them.

    Read more in the :ref:`User Guide <long_tables>`.

    Attributes
    ----------
    queries : list
        The distinct queries of all sets, in order of first appearance.
    query_codes : ndarray of shape (n_evaluations,), dtype int64
        For each evaluation, the index of its query in ``queries``.
    scores : ndarray of shape (n_evaluations,), dtype float64
        The scores, each in [0, 1].
    offsets : ndarray of shape (n_sets + 1,), dtype int64
        Where each set starts in the flat arrays; the last entry is ``n_evaluations``.
    model_names : list of str or None
        The model of each set, when known.
    """

    queries: list
    query_codes: np.ndarray
    scores: np.ndarray
    offsets: np.ndarray
    model_names: list | None = None

    @property
    def n_sets(self) -> int:
        """Number of evaluation sets (models)."""
        return len(self.offsets) - 1

    @property
    def sizes(self) -> np.ndarray:
        """Number of evaluations of each set, shape ``(n_sets,)``."""
        return np.diff(self.offsets)

    def set_codes(self, i: int) -> np.ndarray:
        """Query codes of set ``i``, shape ``(n_i,)``."""
        return self.query_codes[self.offsets[i] : self.offsets[i + 1]]

    def set_scores(self, i: int) -> np.ndarray:
        """Scores of set ``i``, shape ``(n_i,)``."""
        return self.scores[self.offsets[i] : self.offsets[i + 1]]

    def in_canonical_order(self) -> RaggedEvaluations:
        """Return the same sets in an order that does not depend on the order given.

        Queries are sorted by type name and ``repr``, each set's evaluations by
        query, and the sets by their content (identical sets are interchangeable).
        Training on the result makes a fit independent of the order of the sets
        and of each set's evaluations. ``model_names`` are dropped: they follow no
        set after reordering.
        """
        keys = [query_sort_key(query) for query in self.queries]
        query_order = sorted(range(len(keys)), key=keys.__getitem__)
        recode = np.empty(len(query_order), dtype=np.int64)
        recode[query_order] = np.arange(len(query_order))
        codes = recode[self.query_codes]
        owner = np.repeat(np.arange(self.n_sets), self.sizes)
        within = np.lexsort((codes, owner))
        codes, scores = codes[within], self.scores[within]
        offsets = self.offsets
        digests = [
            hashlib.sha256(
                codes[offsets[i] : offsets[i + 1]].tobytes()
                + scores[offsets[i] : offsets[i + 1]].tobytes()
            ).digest()
            for i in range(self.n_sets)
        ]
        set_order = sorted(range(self.n_sets), key=digests.__getitem__)
        within_sets = RaggedEvaluations(
            queries=[self.queries[i] for i in query_order],
            query_codes=codes,
            scores=scores,
            offsets=offsets,
        )
        return within_sets.subset(set_order)

    def subset(self, indices) -> RaggedEvaluations:
        """Return the sets ``indices`` (in that order), over the same ``queries``."""
        indices = np.asarray(indices, dtype=np.int64).reshape(-1)
        sizes = self.sizes[indices]
        offsets = np.zeros(len(indices) + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])
        # Evaluation j of the result is evaluation j - offsets[k] of set indices[k].
        take = np.arange(offsets[-1]) + np.repeat(
            self.offsets[indices] - offsets[:-1], sizes
        )
        names = self.model_names
        return RaggedEvaluations(
            queries=self.queries,
            query_codes=self.query_codes[take],
            scores=self.scores[take],
            offsets=offsets,
            model_names=None if names is None else [names[i] for i in indices],
        )

    def to_dicts(self) -> list[dict]:
        """Return the sets as a list of ``{query: score}`` dicts."""
        queries = np.fromiter(self.queries, dtype=object, count=len(self.queries))
        keys = queries[self.query_codes].tolist()
        values = np.asarray(self.scores, dtype=np.float64).tolist()
        bounds = self.offsets.tolist()
        return [
            dict(zip(keys[start:stop], values[start:stop]))
            for start, stop in zip(bounds[:-1], bounds[1:])
        ]

    @classmethod
    def from_long(
        cls, frame, *, model="model", query="query", score="score", duplicates="error"
    ) -> RaggedEvaluations:
        """Read a long table of evaluations straight into the ragged form.

        What :func:`from_long` reads, with the same checks and messages, but
        kept as arrays: no dict per model is built, so a large table costs a few
        vectorised passes. Every estimator of sklocus takes the result where it
        takes evaluation sets.

        Parameters
        ----------
        frame : pandas.DataFrame
            One row per evaluation.
        model, query, score : str, default="model", "query", "score"
            Names of the columns.
        duplicates : {"error", "mean", "majority"}, default="error"
            As for :func:`from_long`.

        Returns
        -------
        RaggedEvaluations
            Sets in order of each model's first row; ``model_names`` set.

        Examples
        --------
        >>> import pandas as pd
        >>> from sklocus.evaluations import RaggedEvaluations
        >>> frame = pd.DataFrame({"model": ["a", "b", "a"], "query": ["q1", "q1", "q2"],
        ...                       "score": [1, 0, 1]})
        >>> ragged = RaggedEvaluations.from_long(frame)
        >>> ragged.model_names, ragged.sizes.tolist(), ragged.to_dicts()[0]
        (['a', 'b'], [2, 1], {'q1': 1.0, 'q2': 1.0})
        """
        return _ragged_from_long(frame, model, query, score, duplicates)


def _describe_set(index: int, model_names: Sequence | None) -> str:
    if model_names is not None:
        return f"evaluation set {index} (model {model_names[index]!r})"
    return f"evaluation set {index}"


def _first_bad_score(values: np.ndarray) -> tuple[int, str] | None:
    """Locate the first value that is not a valid score.

    Returns ``(position, reason)`` or ``None`` when every value is a finite number in
    [0, 1]; the reason is ``"missing"`` (NaN, as pandas reads an empty cell),
    ``"non-numeric"`` or ``"out of range"``. This is the one definition of a valid
    score in sklocus.
    """
    if values.dtype.kind not in "biuf":
        for position, value in enumerate(values):
            if isinstance(value, str | bytes) or not isinstance(value, numbers.Real):
                return position, "non-numeric"
        values = values.astype(np.float64)
    if values.dtype.kind == "b":
        return None
    values = values.astype(np.float64, copy=False)
    bad = ~(np.isfinite(values) & (values >= 0.0) & (values <= 1.0))
    if bad.any():
        position = int(np.argmax(bad))
        return position, "missing" if np.isnan(values[position]) else "out of range"
    return None


def _score_problem(query, value, reason: str) -> tuple[type, str]:
    """Return what is wrong with one score: an error type, and words for a message."""
    if isinstance(value, np.generic):
        value = value.item()
    if reason == "missing":
        # NaN is how pandas reads an empty cell: "score nan" reads as a value.
        return ValueError, (
            f"has no score for query {shown(query)} (it is missing: NaN, or an "
            "empty cell); scores must be numbers in [0, 1]"
        )
    if reason == "non-numeric":
        return TypeError, (
            f"has score {shown(value)} ({type(value).__name__}) for query "
            f"{shown(query)}; scores must be numbers in [0, 1]"
        )
    return ValueError, (
        f"has score {shown(value)} for query {shown(query)}; scores must be finite "
        "numbers in [0, 1]"
    )


def _score_error(where: str, query, value, reason: str) -> Exception:
    error_type, problem = _score_problem(query, value, reason)
    return error_type(f"{where} {problem}")


def _row_error(error_type, row, detail):
    """Return an error about one row of a long table: ``row LABEL detail``.

    The row's index label and ``detail`` are kept on the error, as ``row`` and
    ``detail``, so that a reader of a file (the command line) can name the row
    as the file numbers it (a CSV file's line).
    """
    error = error_type(f"row {shown(row)} {detail}")
    error.row, error.detail = row, detail
    return error


def _as_list_of_sets(evaluation_sets, model_names):
    """Check the outer container and return ``(list_of_sets, model_names)``."""
    if isinstance(evaluation_sets, pd.DataFrame):
        raise TypeError(
            "expected a sequence of evaluation sets (one mapping from query to score "
            "per model); got a DataFrame. Use sklocus.evaluations.from_long for a long "
            "table, or [row.dropna() for _, row in frame.iterrows()] for a models x "
            "queries table"
        )
    is_bare_series = isinstance(evaluation_sets, pd.Series) and (
        evaluation_sets.dtype.kind in "biuf"
        or not all(isinstance(v, Mapping | pd.Series) for v in evaluation_sets)
    )
    if isinstance(evaluation_sets, Mapping) or is_bare_series:
        raise TypeError(
            "expected a sequence of evaluation sets, one mapping from query to score "
            f"per model; got a single {type(evaluation_sets).__name__}. Wrap one "
            "model's evaluations in a list: [evaluations]"
        )
    if isinstance(evaluation_sets, str | bytes) or not isinstance(
        evaluation_sets, Iterable
    ):
        raise TypeError(
            "expected a sequence of evaluation sets, one mapping from query to score "
            f"per model; got {type(evaluation_sets).__name__}"
        )
    if isinstance(evaluation_sets, pd.Series):
        if model_names is None and not isinstance(evaluation_sets.index, pd.RangeIndex):
            model_names = [str(name) for name in evaluation_sets.index]
        sets = list(evaluation_sets.to_numpy())
    else:
        sets = list(evaluation_sets)
    if not sets:
        raise ValueError("expected at least one evaluation set; got an empty sequence")
    if model_names is not None:
        model_names = as_item_list(model_names, "model names")
        if len(model_names) != len(sets):
            raise ValueError(
                f"got {len(model_names)} model names for {len(sets)} evaluation sets; "
                "give one name per set"
            )
    return sets, model_names


def _set_items(evaluation_set, where: str):
    """Return ``(queries, scores)`` of one set, both as 1-D arrays."""
    if isinstance(evaluation_set, pd.Series):
        index = evaluation_set.index
        if isinstance(index, pd.MultiIndex):
            queries = np.empty(len(index), dtype=object)
            queries[:] = list(index)
        else:
            queries = index.to_numpy(dtype=object)
            if index.dtype == object:
                for query in queries:
                    try:
                        hash(query)
                    except TypeError:
                        raise TypeError(
                            f"{where} has query {query!r} of unhashable type "
                            f"{type(query).__name__}; queries must be hashable "
                            "(a text or an id)"
                        ) from None
        if not index.is_unique:
            repeated = index[index.duplicated()][0]
            raise ValueError(
                f"{where} has query {repeated!r} more than once; give each query "
                "once (from_long(..., duplicates='mean' or 'majority') resolves "
                "repeated evaluations)"
            )
        scores = evaluation_set.to_numpy()
    elif isinstance(evaluation_set, Mapping):
        queries = np.empty(len(evaluation_set), dtype=object)
        queries[:] = list(evaluation_set.keys())
        values = list(evaluation_set.values())
        try:
            scores = np.asarray(values)
        except ValueError:  # sequences of several lengths among the values
            scores = _object_array(values)
    else:
        raise TypeError(
            f"{where} is a {type(evaluation_set).__name__}; expected a mapping from "
            "query to score (a dict or a pandas Series)"
        )
    if len(queries) == 0:
        raise ValueError(f"{where} is empty; every model needs at least one evaluation")
    if scores.ndim != 1:
        # np.asarray turned sequence-valued scores into a 2-D array.
        scores = _object_array(list(evaluation_set.values()))
    return queries, scores


def _object_array(values):
    """Return ``values`` as a 1-D object array, each kept whole (a list stays one)."""
    out = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):
        out[i] = value
    return out


def _check_distinct_codes(codes, offsets, uniques, model_names):
    """Refuse a set in which two keys are one query to pandas.

    A dict keeps its keys apart and a Series index is checked for repeats, but
    two NaN objects, or None and NaN, are both pandas' missing query.
    """
    missing = np.flatnonzero(pd.isna(uniques))
    if not len(missing):
        return
    at = np.flatnonzero(codes == missing[0])
    set_of = np.searchsorted(offsets, at, side="right") - 1
    repeated = np.flatnonzero(np.diff(set_of) == 0)
    if len(repeated):
        where = _describe_set(int(set_of[repeated[0]]), model_names)
        raise ValueError(
            f"{where} has the missing query more than once (None and NaN keys are "
            "both read as one missing query); give each query once"
        )


def reusable(evaluation_sets):
    """Return the sets as given, or in a list when they are a one-shot iterator.

    For callers that read the sets twice (check, then embed): a generator would
    be spent by the first reading and look empty to the second.
    """
    if isinstance(evaluation_sets, Iterator):
        return list(evaluation_sets)
    return evaluation_sets


def check_evaluation_sets(evaluation_sets, model_names=None) -> RaggedEvaluations:
    """Validate evaluation sets and flatten them for batching.

    Every estimator of sklocus calls this on its input. Nothing the user gave is
    changed: the sets are read, never modified.

    Read more in the :ref:`User Guide <evaluation_sets>`.

    Parameters
    ----------
    evaluation_sets : sequence of mappings
        One mapping from query to score per model: a ``dict`` or a pandas ``Series``.
        Queries are texts or any hashable ids; scores are numbers in [0, 1].
    model_names : sequence of str, default=None
        One name per set, used in error messages and kept on the result.

    Returns
    -------
    RaggedEvaluations
        The sets as flat arrays.

    Raises
    ------
    TypeError
        If the input is a single mapping rather than a sequence of them, a set is not
        a mapping, a query is unhashable or a score is not a number. The message
        names the set (index and, where known, model), the query and the value.
    ValueError
        If there are no sets, a set is empty, a query repeats within a set, or a score
        is NaN, infinite or outside [0, 1].

    Examples
    --------
    >>> from sklocus.evaluations import check_evaluation_sets
    >>> ragged = check_evaluation_sets([{"q1": 1, "q2": 0}, {"q2": 1.0}])
    >>> ragged.queries, ragged.sizes.tolist()
    (['q1', 'q2'], [2, 1])
    """
    if isinstance(evaluation_sets, RaggedEvaluations):
        return _check_ragged(evaluation_sets, model_names)
    sets, model_names = _as_list_of_sets(evaluation_sets, model_names)
    # Pools are often dense: many sets list the same queries in the same order.
    # Each distinct sequence of queries is coded once, and the others reuse its
    # codes, so the cost per evaluation is a tuple and a score.
    sequences, distinct, sequence_of = {}, [], []
    all_scores, sizes = [], []
    for index, evaluation_set in enumerate(sets):
        where = _describe_set(index, model_names)
        if type(evaluation_set) is dict and evaluation_set:
            keys = tuple(evaluation_set)
            sequence = sequences.get(keys)
            if sequence is None:
                sequence = sequences[keys] = len(distinct)
                distinct.append(np.fromiter(keys, dtype=object, count=len(keys)))
            queries, scores = distinct[sequence], _dict_scores(evaluation_set)
        else:
            queries, scores = _set_items(evaluation_set, where)
            sequence = len(distinct)
            distinct.append(queries)
        bad = _first_bad_score(scores)
        if bad is not None:
            position, reason = bad
            raise _score_error(where, queries[position], scores[position], reason)
        sequence_of.append(sequence)
        all_scores.append(scores.astype(np.float64))
        sizes.append(len(queries))
    codes, uniques = _factorize(np.concatenate(distinct))
    starts = np.cumsum([0] + [len(queries) for queries in distinct])
    codes = codes.astype(np.int64, copy=False)
    codes = np.concatenate([codes[starts[k] : starts[k + 1]] for k in sequence_of])
    offsets = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    _check_distinct_codes(codes, offsets, uniques, model_names)
    return RaggedEvaluations(
        queries=list(uniques),
        query_codes=codes,
        scores=np.concatenate(all_scores),
        offsets=offsets,
        model_names=model_names,
    )


def _factorize(queries):
    """Code ``queries`` in order of first appearance, a missing query included.

    As ``pd.factorize(queries, use_na_sentinel=False)``, which looks for missing
    values in a pass of its own over every query: pandas' sentinel finds them
    while it hashes, and the missing query, when there is one, is put back in
    its place here.
    """
    codes, uniques = pd.factorize(queries)
    uniques = list(uniques)
    missing = np.flatnonzero(codes < 0)
    if len(missing):
        first = int(missing[0])
        before = int(codes[:first].max()) + 1 if first else 0
        codes = np.where(codes >= before, codes + 1, codes)
        codes[missing] = before
        uniques.insert(before, queries[first])
    return codes, uniques


def _dict_scores(evaluation_set):
    """Return the scores of a dict as ``_set_items`` reads them."""
    values = list(evaluation_set.values())
    try:
        scores = np.asarray(values)
    except ValueError:  # sequences of several lengths among the values
        return _object_array(values)
    return scores if scores.ndim == 1 else _object_array(values)


def _check_ragged(ragged, model_names):
    """Validate evaluation sets given in the ragged form, as whole arrays."""
    if model_names is None:
        model_names = ragged.model_names
    else:
        model_names = as_item_list(model_names, "model names")
    if model_names is not None and len(model_names) != ragged.n_sets:
        raise ValueError(
            f"got {len(model_names)} model names for {ragged.n_sets} evaluation "
            "sets; give one name per set"
        )
    codes = np.asarray(ragged.query_codes)
    scores = np.asarray(ragged.scores)
    offsets = np.asarray(ragged.offsets)
    n_queries = len(ragged.queries)
    if codes.ndim != 1 or codes.dtype.kind not in "iu":
        raise TypeError(
            f"query_codes must be a 1-D array of integers; got shape {codes.shape} "
            f"and dtype {codes.dtype}"
        )
    if scores.shape != codes.shape:
        raise ValueError(
            f"scores has shape {scores.shape} but query_codes has {codes.shape}; "
            "give one score per evaluation"
        )
    if (
        offsets.ndim != 1
        or offsets.dtype.kind not in "iu"
        or len(offsets) < 2
        or offsets[0] != 0
        or offsets[-1] != len(codes)
    ):
        raise ValueError(
            "offsets must be integers from 0 to the number of evaluations "
            f"({len(codes)}), one more than the number of sets; got {offsets!r}"
        )
    sizes = np.diff(offsets)
    if (sizes <= 0).any():
        index = int(np.argmax(sizes <= 0))
        where = _describe_set(index, model_names)
        if sizes[index] < 0:
            raise ValueError(f"offsets decrease at {where}; they must not")
        raise ValueError(f"{where} is empty; every model needs at least one evaluation")
    outside = (codes < 0) | (codes >= n_queries)
    if outside.any():
        position = int(np.argmax(outside))
        where = _describe_set(_set_of(offsets, position), model_names)
        raise ValueError(
            f"{where} has query code {int(codes[position])}; codes must index the "
            f"{n_queries} queries"
        )
    bad = _first_bad_score(scores)
    if bad is not None:
        position, reason = bad
        where = _describe_set(_set_of(offsets, position), model_names)
        query = ragged.queries[codes[position]]
        raise _score_error(where, query, scores[position], reason)
    # A query twice in one set: sets are contiguous, so (set, code) pairs repeat
    # only within a set.
    pair = np.repeat(np.arange(len(sizes), dtype=np.int64), sizes) * n_queries + codes
    if len(sizes) * n_queries <= 4 * len(pair) + _DENSE_PAIRS:
        # Dense enough to count every (set, query) pair: linear, not a sort.
        counts = np.bincount(pair, minlength=len(sizes) * n_queries)
        repeated = np.flatnonzero(counts > 1)
    else:
        ordered = np.sort(pair)
        repeated = ordered[np.flatnonzero(ordered[1:] == ordered[:-1])]
    if len(repeated):
        index, code = divmod(int(repeated[0]), n_queries)
        raise ValueError(
            f"{_describe_set(index, model_names)} has query "
            f"{ragged.queries[code]!r} more than once; give each query once"
        )
    return RaggedEvaluations(
        queries=list(ragged.queries),
        query_codes=codes.astype(np.int64, copy=False),
        scores=scores.astype(np.float64, copy=False),
        offsets=offsets.astype(np.int64, copy=False),
        model_names=None if model_names is None else list(model_names),
    )


def _set_of(offsets, position):
    """Return the set that evaluation ``position`` belongs to."""
    return int(np.searchsorted(offsets, position, side="right") - 1)


def from_long(
    frame, *, model="model", query="query", score="score", duplicates="error"
):
    """Turn a long table of evaluations into evaluation sets.

    A long table has one row per evaluation, the way evaluation harnesses log results.

    Read more in the :ref:`User Guide <long_tables>`.

    Parameters
    ----------
    frame : pandas.DataFrame
        The evaluations.
    model, query, score : str, default="model", "query", "score"
        Names of the columns holding the model, the query and the score.
    duplicates : {"error", "mean", "majority"}, default="error"
        What to do with several rows for one (model, query) pair. ``"error"`` raises,
        naming the pair; ``"mean"`` averages their scores; ``"majority"`` takes the
        most frequent score, and on a tie the mean of the tied scores (so a 0/1 tie
        gives 0.5). Missing scores are never filled in: a NaN score is an error.

    Returns
    -------
    evaluation_sets : list of dict
        One ``{query: score}`` dict per model, queries in order of first appearance.
    model_names : list
        The models, in order of first appearance in ``frame``.

    Examples
    --------
    >>> import pandas as pd
    >>> from sklocus.evaluations import from_long
    >>> frame = pd.DataFrame({"model": ["a", "a", "b"], "query": ["q1", "q2", "q1"],
    ...                       "score": [1, 0, 1]})
    >>> from_long(frame)
    ([{'q1': 1.0, 'q2': 0.0}, {'q1': 1.0}], ['a', 'b'])
    """
    ragged = _ragged_from_long(frame, model, query, score, duplicates)
    return ragged.to_dicts(), ragged.model_names


def _ragged_from_long(frame, model, query, score, duplicates):
    """Read a long table into the ragged form, checked as whole arrays."""
    if not isinstance(frame, pd.DataFrame):
        raise TypeError(
            f"from_long expects a pandas DataFrame; got {type(frame).__name__}"
        )
    if duplicates not in _DUPLICATE_RULES:
        raise ValueError(
            f"duplicates={duplicates!r} is not understood; expected one of "
            f"{_DUPLICATE_RULES}"
        )
    _check_long_columns(frame.columns, model=model, query=query, score=score)
    if len(frame) == 0:
        raise ValueError("the frame has no rows; expected one row per evaluation")
    for role, column in (("model", model), ("query", query)):
        missing = frame[column].isna().to_numpy()
        if missing.any():
            detail = f"has no {role} (column {column!r} is empty or NaN)"
            raise _row_error(ValueError, frame.index[np.argmax(missing)], detail)

    scores = frame[score].to_numpy()
    bad = _first_bad_score(scores)
    if bad is not None:
        position, reason = bad
        error_type, problem = _score_problem(
            frame[query].iloc[position], scores[position], reason
        )
        detail = f"(model {shown(frame[model].iloc[position])}) {problem}"
        raise _row_error(error_type, frame.index[position], detail)

    model_codes, model_names = pd.factorize(frame[model])
    query_codes, query_values = pd.factorize(frame[query])
    query_values = np.asarray(query_values, dtype=object)
    scores = scores.astype(np.float64)
    pair = model_codes.astype(np.int64) * len(query_values) + query_codes
    repeated = pd.Series(pair).duplicated(keep=False).to_numpy()
    if repeated.any():
        if duplicates == "error":
            raise _repeated_pair_error(
                frame, pair, int(np.argmax(repeated)), model_names, query_values
            )
        kept, resolved_scores = _resolve_duplicates(pair, scores, repeated, duplicates)
        model_codes, query_codes = model_codes[kept], query_codes[kept]
        scores = resolved_scores

    order = np.argsort(model_codes, kind="stable")
    offsets = np.zeros(len(model_names) + 1, dtype=np.int64)
    np.cumsum(np.bincount(model_codes, minlength=len(model_names)), out=offsets[1:])
    return RaggedEvaluations(
        queries=list(query_values),
        query_codes=query_codes[order].astype(np.int64, copy=False),
        scores=scores[order],
        offsets=offsets,
        model_names=list(model_names),
    )


def _repeated_pair_error(frame, pair, first, model_names, query_values):
    """Return the error for a (model, query) pair in several rows, ``first`` first.

    Its message names the keyword that resolves it (``duplicates='mean'``);
    besides ``row`` (the first row's label), it keeps ``rows`` (every row's
    label), ``detail`` (the message without the remedy) and ``keyword``, so
    that the command line names its own option, ``--duplicates``.
    """
    rows = frame.index[np.flatnonzero(pair == pair[first])]
    model = model_names[pair[first] // len(query_values)]
    query = query_values[pair[first] % len(query_values)]
    detail = f"model {shown(model)} has {len(rows)} rows for query {shown(query)}"
    shown_rows = ", ".join(shown(row) for row in rows[:3])
    error = ValueError(
        f"{detail} (rows {shown_rows}{', ...' if len(rows) > 3 else ''}); pass "
        "duplicates='mean' or duplicates='majority' to resolve repeated evaluations"
    )
    error.row, error.rows, error.detail = rows[0], list(rows), detail
    error.keyword = "duplicates"
    return error


def _check_long_columns(columns, *, model, query, score, where="the frame"):
    """Fail, naming the role and listing ``columns``, when a long column is missing.

    The one check of :func:`from_long` and the streaming readers of long tables.
    """
    columns = list(columns)
    for role, column in (("model", model), ("query", query), ("score", score)):
        if column not in columns:
            raise KeyError(
                f"the {role} column {column!r} is not in {where}; its columns are "
                f"{columns}"
            )


def _resolve_duplicates(pair, scores, repeated, rule):
    """Collapse the rows of each repeated (model, query) pair into one.

    Returns the positions of the rows kept (the first row of each pair, in the
    original order) and the score of every kept row.
    """
    rows = pd.DataFrame({"pair": pair[repeated], "score": scores[repeated]})
    if rule == "mean":
        resolved = rows.groupby("pair", sort=False)["score"].mean()
    else:
        counts = rows.groupby(["pair", "score"], sort=False).size()
        counts = counts.rename("count").reset_index()
        top = counts.groupby("pair", sort=False)["count"].transform("max")
        winners = counts[counts["count"] == top]
        resolved = winners.groupby("pair", sort=False)["score"].mean()
    first_of_pair = ~pd.Series(pair).duplicated(keep="first").to_numpy()
    kept = np.flatnonzero(~repeated | first_of_pair)
    new_scores = scores[kept].copy()
    was_repeated = repeated[kept]
    new_scores[was_repeated] = resolved.loc[pair[kept][was_repeated]].to_numpy()
    return kept, new_scores


def to_matrix(evaluation_sets, queries=None, model_names=None):
    """Arrange evaluation sets as a queries x models matrix: one column per model.

    Read more in the :ref:`User Guide <evaluation_sets>`.

    Parameters
    ----------
    evaluation_sets : sequence of mappings
        One mapping from query to score per model.
    queries : sequence, default=None
        The rows, in order. By default the distinct queries of all sets in order of
        first appearance. When given, evaluations of other queries are left out and
        queries no set has give all-NaN rows.
    model_names : sequence of str, default=None
        Names used in error messages.

    Returns
    -------
    matrix : ndarray of shape (n_queries, n_models), dtype float64
        Scores, NaN where a model was not evaluated on a query: the ``Y`` of
        :meth:`LocusRouter.fit <sklocus.LocusRouter.fit>` and the ``scores`` of
        :mod:`sklocus.metrics`.
    queries : list
        The query of each row.

    Examples
    --------
    >>> from sklocus.evaluations import to_matrix
    >>> matrix, queries = to_matrix([{"q1": 1, "q2": 0}, {"q2": 1}])
    >>> matrix
    array([[ 1., nan],
           [ 0.,  1.]])
    """
    ragged = check_evaluation_sets(evaluation_sets, model_names)
    rows = np.repeat(np.arange(ragged.n_sets), ragged.sizes)
    columns, values = ragged.query_codes, ragged.scores
    if queries is None:
        queries = list(ragged.queries)
    else:
        queries = as_item_list(queries, "queries")
        position = {}
        for column, query in enumerate(queries):
            if query in position:
                raise ValueError(f"query {query!r} appears more than once in queries")
            position[query] = column
        lookup = np.array([position.get(q, -1) for q in ragged.queries], dtype=np.int64)
        columns = lookup[columns]
        kept = columns >= 0
        rows, columns, values = rows[kept], columns[kept], values[kept]
    matrix = np.full((len(queries), ragged.n_sets), np.nan)
    matrix[columns, rows] = values
    return matrix, queries


def from_matrix(matrix, queries, model_names=None):
    """Turn a queries x models matrix into evaluation sets: the inverse of to_matrix.

    Read more in the :ref:`User Guide <evaluation_sets>`.

    Parameters
    ----------
    matrix : array-like of shape (n_queries, n_models)
        Scores in [0, 1], NaN where a model was not evaluated on a query.
    queries : sequence of length n_queries
        The query of each row; distinct.
    model_names : sequence of str, default=None
        Names used in error messages.

    Returns
    -------
    list of dict
        One ``{query: score}`` dict per column, its observed scores in row order.

    Examples
    --------
    >>> import numpy as np
    >>> from sklocus.evaluations import from_matrix
    >>> from_matrix([[1, np.nan], [0, 1]], ["q1", "q2"])
    [{'q1': 1.0, 'q2': 0.0}, {'q2': 1.0}]
    """
    try:
        matrix = np.asarray(matrix, dtype=np.float64)
    except (TypeError, ValueError) as error:
        raise type(error)(
            f"the matrix must hold numbers (n_queries, n_models): {error}"
        ) from None
    queries = as_item_list(queries, "queries")
    if matrix.ndim != 2 or matrix.shape[0] != len(queries):
        raise ValueError(
            f"the matrix has shape {matrix.shape} for {len(queries)} queries; "
            "expected (n_queries, n_models), one row per query"
        )
    observed = ~np.isnan(matrix)
    evaluation_sets = [
        dict(zip([queries[i] for i in np.flatnonzero(column)], values[column].tolist()))
        for values, column in zip(matrix.T, observed.T)
    ]
    check_evaluation_sets(evaluation_sets, model_names)
    return evaluation_sets


def to_long(
    evaluation_sets, model_names, *, model="model", query="query", score="score"
):
    """Write evaluation sets as a long table: the inverse of from_long.

    Read more in the :ref:`User Guide <long_tables>`.

    Parameters
    ----------
    evaluation_sets : sequence of mappings
        One mapping from query to score per model.
    model_names : sequence of str
        The model of each set.
    model, query, score : str, default="model", "query", "score"
        Names of the table's columns.

    Returns
    -------
    pandas.DataFrame
        One row per evaluation, the sets' rows in order and each set's queries in
        its own order.

    Examples
    --------
    >>> from sklocus.evaluations import to_long
    >>> to_long([{"q1": 1, "q2": 0}, {"q1": 1}], ["a", "b"])
      model query  score
    0     a    q1    1.0
    1     a    q2    0.0
    2     b    q1    1.0
    """
    names = as_item_list(model_names, "model names")
    if len({model, query, score}) != 3:
        raise ValueError(
            f"the columns must have three names; got model={model!r}, "
            f"query={query!r}, score={score!r}"
        )
    ragged = check_evaluation_sets(evaluation_sets, names)  # one name per set
    return pd.DataFrame(
        {
            model: np.repeat(np.asarray(names, dtype=object), ragged.sizes),
            query: np.asarray(ragged.queries, dtype=object)[ragged.query_codes],
            score: ragged.scores.astype(np.float64),
        }
    )


@validate_params(
    {
        "evaluation_sets": "no_validation",
        "n": [Interval(numbers.Integral, 1, None, closed="left")],
        "random_state": ["random_state"],
        "model_names": "no_validation",
        "shared": ["boolean"],
    },
    prefer_skip_nested_validation=True,
)
def subsample(evaluation_sets, n, random_state=None, model_names=None, *, shared=False):
    """Draw ``n`` evaluations of each model, without replacement.

    Read more in the :ref:`User Guide <evaluation_sets>`.

    Parameters
    ----------
    evaluation_sets : sequence of mappings
        One mapping from query to score per model.
    n : int
        Evaluations to keep per model. A set with ``n`` or fewer evaluations is kept
        whole.
    random_state : int, RandomState instance or None, default=None
        Seeds the draw.
    model_names : sequence of str, default=None
        Names used in error messages.
    shared : bool, default=False
        Draw the same queries for every model as far as their sets allow: the
        queries are put in one random order and each model keeps the first ``n`` of
        those it has. Models evaluated on the same queries then keep the same
        subset, so that their subsets differ only where their evaluations do.

    Returns
    -------
    list of dict
        One ``{query: score}`` dict per model, evaluations in their original order.

    Examples
    --------
    >>> from sklocus.evaluations import subsample
    >>> [len(s) for s in subsample([{"a": 1, "b": 0, "c": 1}, {"a": 0}], 2, 0)]
    [2, 1]
    >>> same = subsample([{"a": 1, "b": 0, "c": 1}, {"a": 0, "b": 1, "c": 1}], 2, 0,
    ...                  shared=True)
    >>> same[0].keys() == same[1].keys()
    True
    """
    ragged = check_evaluation_sets(evaluation_sets, model_names)
    rng = check_random_state(random_state)
    rank = rng.permutation(len(ragged.queries)) if shared else None
    subsets = []
    for i in range(ragged.n_sets):
        codes, scores = ragged.set_codes(i), ragged.set_scores(i)
        if len(codes) > n:
            if shared:
                keep = np.sort(np.argsort(rank[codes], kind="stable")[:n])
            else:
                keep = np.sort(rng.choice(len(codes), size=n, replace=False))
            codes, scores = codes[keep], scores[keep]
        subsets.append({ragged.queries[c]: float(s) for c, s in zip(codes, scores)})
    return subsets
