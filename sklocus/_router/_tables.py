"""What a router reads from its callers: tables of scores, costs and queries."""

from __future__ import annotations

import numpy as np
import pandas as pd
from sklearn.exceptions import NotFittedError
from sklearn.utils.validation import check_is_fitted

from sklocus._groups import check_query_groups
from sklocus._validation import check_costs, check_model_names, shown
from sklocus.encoders import as_query_list
from sklocus.evaluations import (
    _first_bad_score,
    check_evaluation_sets,
    from_matrix,
    reusable,
    to_matrix,
)


def check_cost(cost, names):
    """Return ``cost`` as a float array, one finite non-negative value per model."""
    if cost is None:
        return None
    if isinstance(cost, pd.Series):
        missing = [name for name in names if name not in cost.index]
        if missing:
            raise ValueError(f"cost has no value for model {missing[0]!r}")
        cost = cost.loc[list(names)]
    return check_costs(cost, names)


def score_table(Y, queries, classes=None):
    """Return ``(scores, names)``: Y as an (n_queries, n_models) float array.

    A DataFrame's rows are matched to the queries as :func:`_align_rows` says;
    anything else is read row by row.
    """
    if isinstance(Y, pd.DataFrame):
        if isinstance(Y.columns, pd.MultiIndex):
            raise ValueError(
                f"Y's columns have {Y.columns.nlevels} levels, {shown(Y.columns[0])} "
                "first; a router names each model by one label. Join the levels, "
                "e.g. Y.columns = ['/'.join(map(str, c)) for c in Y.columns]"
            )
        if not Y.columns.is_unique:
            repeated = Y.columns[Y.columns.duplicated()][0]
            raise ValueError(
                f"Y names model {shown(repeated)} in more than one column; give each "
                "model one column"
            )
        Y = _align_rows(Y, queries)
        names = np.empty(len(Y.columns), dtype=object)
        names[:] = check_model_names(list(Y.columns), "Y's columns")
        _refuse_text_scores(Y, names, queries)
        try:
            scores = Y.to_numpy(dtype=np.float64, na_value=np.nan)
        except (TypeError, ValueError) as error:
            raise TypeError(f"Y must hold numbers in [0, 1] or NaN: {error}") from None
    else:
        scores = np.asarray(Y, dtype=np.float64)
        if scores.ndim != 2:
            raise ValueError(
                f"Y must be 2-D (n_queries, n_models); got shape {scores.shape}"
            )
        if classes is not None and scores.shape[1] != len(classes):
            raise ValueError(
                f"Y has {scores.shape[1]} columns but the router has "
                f"{len(classes)} models; give one column per model of classes_, "
                "in that order"
            )
        names = np.arange(scores.shape[1]) if classes is None else np.asarray(classes)
    if len(scores) != len(queries):
        raise ValueError(
            f"X has {len(queries)} queries but Y has {len(scores)} rows; give one row "
            "of scores per query"
        )
    if classes is not None and (
        len(names) != len(classes) or not np.array_equal(names, classes)
    ):
        raise ValueError(
            f"Y's columns {list(names)} are not the router's models {list(classes)}"
        )
    flat = scores.ravel()
    observed = np.flatnonzero(~np.isnan(flat))
    bad = _first_bad_score(flat[observed])
    if bad is not None:
        row, column = divmod(int(observed[bad[0]]), scores.shape[1])
        raise ValueError(
            f"Y's score of model {shown(names[column])} on query "
            f"{shown(queries[row])} is {scores[row, column]}; scores must be in "
            "[0, 1], or NaN where unobserved"
        )
    return scores, names


def _align_rows(Y, queries):
    """Y's rows in the order of ``queries`` when Y's index names them.

    An index that holds none of the queries (a ``RangeIndex``, or the row numbers
    a cross-validation split leaves) is read row by row; one that holds every
    query is matched by label; one that holds only some is an error.
    """
    if isinstance(Y.index, pd.RangeIndex):
        return Y
    wanted = pd.Index(queries)
    inside = wanted.isin(Y.index)
    if not inside.any():
        return Y
    if not inside.all():
        missing = queries[int(np.argmin(inside))]
        raise ValueError(
            f"query {shown(missing)} of X is not in Y's index, which names other "
            "queries of X; Y's rows are matched to X by their index labels "
            "(reset_index(drop=True) matches them by position)"
        )
    if not Y.index.is_unique:
        repeated = Y.index[Y.index.duplicated()][0]
        raise ValueError(
            f"Y's index holds query {shown(repeated)} more than once; give each query "
            "one row"
        )
    extra = Y.index.difference(wanted)
    if len(extra):
        raise ValueError(
            f"Y's index holds query {shown(extra[0])}, which is not in X; give one "
            "row of scores per query of X"
        )
    return Y.iloc[Y.index.get_indexer(wanted)]


def is_fitted(estimator):
    try:
        check_is_fitted(estimator)
    except NotFittedError:
        return False
    return True


def check_distinct_queries(queries):
    seen = set()
    for query in queries:
        if query in seen:
            raise ValueError(
                f"query {shown(query)} is in X more than once; give each query once, "
                "with its scores in one row of Y"
            )
        seen.add(query)


def pool_of_table(X, Y, cost=None, query_groups=None):
    """Read ``fit``'s queries, table of scores and costs, checked, as a pool.

    Returns ``(ragged, names, cost, table, query_groups)``: the evaluation sets
    (:class:`~sklocus.evaluations.RaggedEvaluations`), the models' names, their
    costs (or None), ``(queries, scores)`` with scores ``(n_queries,
    n_models)``, NaN where unobserved, and the queries' groups, or None.
    """
    queries = as_query_list(X)
    check_distinct_queries(queries)
    if query_groups is not None:
        query_groups = check_query_groups(query_groups, len(queries))
    scores, names = score_table(Y, queries)
    if not queries or not len(names):
        raise ValueError(
            f"got {len(queries)} queries and {len(names)} models (columns of Y); "
            "fitting a router needs at least one of each"
        )
    cost = check_cost(cost, names)
    empty = np.isnan(scores).all(axis=0)
    if empty.any():
        raise ValueError(
            f"model {names[int(np.argmax(empty))]!r} has no observed score in Y; "
            "every model needs at least one"
        )
    model_names = [str(name) for name in names]
    ragged = check_evaluation_sets(from_matrix(scores, queries), model_names)
    return ragged, names, cost, (queries, scores), query_groups


def pool_of_sets(evaluation_sets, names=None):
    """Read ``fit_evaluations``' sets and names, checked: ``(ragged, names)``.

    ``names`` None numbers the models 0 to n_models - 1, as an array ``Y`` does.
    """
    evaluation_sets = reusable(evaluation_sets)
    if names is None:
        ragged = check_evaluation_sets(evaluation_sets)
        return ragged, np.arange(ragged.n_sets)
    checked = check_model_names(names)
    ragged = check_evaluation_sets(evaluation_sets, [str(n) for n in checked])
    names = np.empty(len(checked), dtype=object)
    names[:] = checked
    return ragged, names


def selected(classes, names, verb):
    """Return the mask of the models named: each one of ``classes``, not all."""
    mask = np.zeros(len(classes), dtype=bool)
    if names is None:
        return mask
    if isinstance(names, str) or not np.iterable(names):
        names = [names]
    for name in names:
        matches = classes == name
        if not matches.any():
            raise ValueError(f"cannot {verb} {name!r}: the router has no such model")
        mask |= matches
    if mask.all():
        raise ValueError(f"cannot {verb} every model; leave at least one")
    return mask


def dense_table(ragged, query_groups, needed):
    """``fit_evaluations``' ``(queries, scores)`` table and groups, or Nones.

    The dense table (scores ``(n_queries, n_models)``, NaN where unobserved) is
    built only where ``needed``: where a stage reads it or ``query_groups`` (a
    mapping from query to group) are given.
    """
    if not needed:
        return None, None
    scores, queries = to_matrix(ragged)
    groups = None
    if query_groups is not None:
        groups = groups_of(query_groups, queries, "fit_evaluations")
    return (queries, scores), groups


def groups_of(query_groups, queries, method):
    """Each query's group from a mapping, checked as ``fit``'s are."""
    if not hasattr(query_groups, "get"):
        raise TypeError(
            f"query_groups is a {type(query_groups).__name__}; {method} takes "
            "a mapping from each query to its group"
        )
    return check_query_groups([query_groups.get(q) for q in queries], len(queries))


def _refuse_text_scores(Y, names, queries):
    """Refuse a score given as text ("1" is not 1), naming where it is.

    pandas would turn such a column into numbers; ``check_evaluation_sets``
    refuses text, and so does every table of scores.
    """
    for column, name in zip(range(Y.shape[1]), names):
        values = Y.iloc[:, column]
        if values.dtype != object:
            continue
        for query, value in zip(queries, values):
            if isinstance(value, str | bytes):
                raise TypeError(
                    f"Y's score of model {shown(name)} on query {shown(query)} is "
                    f"{value!r}, text; scores must be numbers in [0, 1] or NaN"
                )
