"""Query groups: a shrunken per-model, per-group correction of LOCUS's predictions.

Most evaluation tables know each query's benchmark, subject or category. LOCUS
never sees those labels; a per-group tally (each model's accuracy on the query's
group) uses nothing else. :class:`~sklocus.LocusRouter` combines the two: for each
model ``m`` and group ``g`` it adds an offset ``delta[m, g]`` to the logit of
LOCUS's P(correct), the MAP estimate of

    sum_i BCE(logit_i + delta, y_i) + shrinkage / 2 * delta^2

over the model's own evaluations ``(x_i, y_i)`` in the group, where ``logit_i`` is
LOCUS's prediction for them. A group a model has few evaluations in keeps an offset
near 0 (LOCUS as it is); one with many moves as far as the evaluations say LOCUS
is off there. The problem is one-dimensional and convex for each (model, group), so
a few Newton steps solve every pair at once.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from sklocus._validation import as_item_list

# Newton steps of the offset fit; each (model, group) problem is one-dimensional
# and strongly convex, and converges to float precision in far fewer.
_NEWTON_STEPS = 25
# Probabilities are clipped this far from 0 and 1 before taking logits.
_EPS = 1e-6


def check_query_groups(query_groups, n_queries, what="query_groups"):
    """Return ``query_groups`` as an object array of length ``n_queries``.

    Missing labels (None or NaN) mean "no group": such queries get no correction.
    """
    groups = as_item_list(query_groups, what)
    if len(groups) != n_queries:
        raise ValueError(
            f"{what} has {len(groups)} labels for {n_queries} queries; give one "
            "label per query (None where a query has no group)"
        )
    out = np.empty(n_queries, dtype=object)
    for i, label in enumerate(groups):
        if label is not None and not pd.isna(label):
            try:
                hash(label)
            except TypeError:
                raise TypeError(
                    f"{what}[{i}] is {label!r} ({type(label).__name__}); group "
                    "labels must be hashable, such as strings"
                ) from None
        out[i] = None if label is None or pd.isna(label) else label
    return out


def logits(probabilities):
    """Logits of probabilities, clipped away from 0 and 1."""
    p = np.clip(np.asarray(probabilities, dtype=np.float64), _EPS, 1 - _EPS)
    return np.log(p) - np.log1p(-p)


def fit_group_offsets(base_logits, scores, query_groups, shrinkage):
    """Per-model, per-group logit offsets (see the module docstring).

    Parameters
    ----------
    base_logits : ndarray of shape (n_queries, n_models)
        LOCUS's logits for the training queries.
    scores : ndarray of shape (n_queries, n_models)
        Observed scores in [0, 1], NaN where unobserved.
    query_groups : ndarray of shape (n_queries,), dtype object
        Each query's group, None for none (from :func:`check_query_groups`).
    shrinkage : float
        Prior precision of each offset, in units of the log loss summed over the
        group's evaluations.

    Returns
    -------
    groups : ndarray of shape (n_groups,), dtype object
        The distinct labels, in order of first appearance.
    offsets : ndarray of shape (n_models, n_groups), float32
    """
    labelled = np.flatnonzero([g is not None for g in query_groups])
    codes, groups = pd.factorize(pd.Series(query_groups[labelled], dtype=object))
    groups = np.asarray(groups, dtype=object)
    n_models = scores.shape[1]
    offsets = np.zeros((n_models, len(groups)))
    if not len(groups):
        return groups, offsets.astype(np.float32)
    rows, models = np.nonzero(~np.isnan(scores[labelled]))
    cell = models * len(groups) + codes[rows]
    queries = labelled[rows]
    y = scores[queries, models]
    base = base_logits[queries, models]
    flat = offsets.ravel()
    for _ in range(_NEWTON_STEPS):
        p = 1.0 / (1.0 + np.exp(-(base + flat[cell])))
        gradient = np.bincount(cell, p - y, flat.size) + shrinkage * flat
        curvature = np.bincount(cell, p * (1 - p), flat.size) + shrinkage
        flat -= gradient / curvature
    return groups, offsets.astype(np.float32)


def apply_group_offsets(probabilities, query_groups, groups, offsets):
    """Add each model's offset for each query's group to the logit of ``probabilities``.

    Parameters
    ----------
    probabilities : ndarray of shape (n_queries, n_models)
    query_groups : ndarray of shape (n_queries,), dtype object
        Labels of the queries; a label not in ``groups`` (or None) is left alone.
    groups : ndarray of shape (n_groups,)
    offsets : ndarray of shape (n_models, n_groups)

    Returns
    -------
    ndarray of shape (n_queries, n_models), float32
    """
    column = {label: j for j, label in enumerate(groups)}
    index = np.array([column.get(label, -1) for label in query_groups], dtype=np.int64)
    known = index >= 0
    out = np.asarray(probabilities, dtype=np.float32).copy()
    if known.any():
        shifted = logits(out[known]) + offsets[:, index[known]].T
        out[known] = 1.0 / (1.0 + np.exp(-shifted))
    return out
