"""The geometry of the model space: distances, substitutes and neighbours.

Every function takes embeddings of shape ``(n_models, embedding_dim)``, as made by
:meth:`LocusEmbedder.transform <sklocus.LocusEmbedder.transform>`, and a ``metric``,
``"euclidean"`` (the default) or ``"cosine"``.

``LocusEmbedder`` returns embeddings in units of the median distance between two of
its training models (``embedding_scale_``), so a Euclidean distance reads the same
for every embedder: 1 is a typical pair, and 1e-4 is a pair that behaves alike on
everything the embedder can tell apart. The thresholds of :func:`find_duplicates`
and :func:`stable_duplicates` default to values measured in those units on the
Open LLM Leaderboard data (:doc:`/research/results`). Cosine distance ignores the
norm and measures angles from the origin, which every embedding shares a direction
away from; it ranks pairs about as well on that data, but has no such unit.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping

import numpy as np
import pandas as pd
from scipy import stats
from scipy.cluster import hierarchy
from scipy.spatial.distance import cdist, squareform
from sklearn.utils import check_random_state

from sklocus._sklearn_compat import HasMethods, Interval, StrOptions, validate_params
from sklocus._validation import as_item_list
from sklocus.evaluations import subsample

__all__ = [
    "check_embeddings",
    "cluster_models",
    "disagreement_correlation",
    "find_duplicates",
    "model_distances",
    "nearest_models",
    "profile_evaluation_set",
    "search_by_profile",
    "stable_duplicates",
]

METRICS = ("euclidean", "cosine")
# The constraints of the arguments the public functions share, for validate_params.
_METRIC = [StrOptions(set(METRICS))]
_COUNT = [Interval(numbers.Integral, 1, None, closed="left")]
_THRESHOLD = [Interval(numbers.Real, 0, None, closed="right")]  # inf keeps every pair
_EMBEDDER = [HasMethods(["transform"])]
# Default thresholds, in units of LocusEmbedder.embedding_scale_ (Euclidean).
DUPLICATE_THRESHOLD = 1e-4
STABLE_DUPLICATE_THRESHOLD = 3e-4


def check_embeddings(embeddings, *, name="embeddings", dim=None, dtype=np.float64):
    """Check model embeddings: a finite 2-D float array.

    The one check of embeddings given to sklocus: the geometry, the model map and
    :meth:`sklocus.LocusEmbedder.predict_correctness` all call it.

    Parameters
    ----------
    embeddings : array-like of shape (n_models, embedding_dim)
    name : str, default="embeddings"
        What to call them in error messages.
    dim : int, default=None
        The width they must have (an embedder's ``embedding_dim``); any if None.
    dtype : numpy dtype, default=numpy.float64
        The type of the array returned.

    Returns
    -------
    ndarray of shape (n_models, embedding_dim)
    """
    try:
        embeddings = np.asarray(embeddings, dtype=dtype)
    except (TypeError, ValueError) as error:
        raise type(error)(
            f"{name} must be a 2-D array of numbers (n_models, "
            f"{'embedding_dim' if dim is None else dim}): {error}"
        ) from None
    if embeddings.ndim != 2:
        raise ValueError(
            f"{name} must be a 2-D array (n_models, embedding_dim); got shape "
            f"{embeddings.shape}"
        )
    if dim is not None and embeddings.shape[1] != dim:
        raise ValueError(
            f"{name} have shape {embeddings.shape}; this embedder makes "
            f"(n_models, {dim}) embeddings"
        )
    finite = np.isfinite(embeddings).all(axis=1)
    if not finite.all():
        raise ValueError(f"{name} row {int(np.argmin(finite))} is not finite")
    return embeddings


def _unit(embeddings):
    """Rows scaled to length 1 in float64 (all-zero rows become NaN)."""
    rows = np.asarray(embeddings, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        return rows / np.linalg.norm(rows, axis=1, keepdims=True)


@validate_params(
    {"embeddings": ["array-like"], "other": ["array-like", None], "metric": _METRIC},
    prefer_skip_nested_validation=True,
)
def model_distances(embeddings, other=None, *, metric="euclidean"):
    """Distances between models.

    Read more in the :ref:`User Guide <distances>`.

    Parameters
    ----------
    embeddings : array-like of shape (n_models, embedding_dim)
    other : array-like of shape (n_other, embedding_dim), default=None
        Distances to these models; by default among ``embeddings`` themselves.
    metric : {"euclidean", "cosine"}, default="euclidean"
        Cosine distance is ``1 - cos(angle)``, in [0, 2], computed as half the
        squared distance between the unit vectors (in float64), so that close
        pairs keep their relative precision instead of drowning in the rounding
        of ``1 - cos``; an all-zero embedding is at cosine distance 1 from every
        other model, as in scikit-learn, and 0 from itself.

    Returns
    -------
    ndarray of shape (n_models, n_other)

    Examples
    --------
    >>> from sklocus.geometry import model_distances
    >>> model_distances([[1, 0], [0, 2]], metric="euclidean").round(3)
    array([[0.   , 2.236],
           [2.236, 0.   ]])
    """
    embeddings = check_embeddings(embeddings)
    other = embeddings if other is None else check_embeddings(other, name="other")
    if other.shape[1] != embeddings.shape[1]:
        raise ValueError(
            f"other has width {other.shape[1]} but embeddings have width "
            f"{embeddings.shape[1]}"
        )
    # cdist computes each distance from the difference of the two vectors:
    # identical models get exactly 0, which the faster dot-product expansion of
    # scikit-learn does not promise, and near-duplicates, at 1e-4 of a typical
    # distance, keep their digits.
    if metric == "euclidean":
        distances = cdist(embeddings, other, metric="euclidean")
    else:
        distances = 0.5 * cdist(_unit(embeddings), _unit(other), metric="sqeuclidean")
    distances = np.nan_to_num(np.maximum(distances, 0.0), nan=1.0)
    if other is embeddings:
        # An all-zero embedding is at cosine distance 1 from the others, not from
        # itself.
        np.fill_diagonal(distances, 0.0)
    return distances


@validate_params(
    {"embeddings": ["array-like"], "k": _COUNT, "metric": _METRIC},
    prefer_skip_nested_validation=True,
)
def nearest_models(embeddings, k=5, *, metric="euclidean"):
    """Each model's ``k`` nearest other models.

    Read more in the :ref:`User Guide <distances>`.

    Parameters
    ----------
    embeddings : array-like of shape (n_models, embedding_dim)
    k : int, default=5
        Neighbours per model; at most ``n_models - 1``.
    metric : {"euclidean", "cosine"}, default="euclidean"

    Returns
    -------
    indices : ndarray of shape (n_models, k), int
        The neighbours, nearest first (ties by index).
    distances : ndarray of shape (n_models, k)

    Examples
    --------
    >>> from sklocus.geometry import nearest_models
    >>> indices, distances = nearest_models([[0.0], [1.0], [3.0]], k=1,
    ...                                     metric="euclidean")
    >>> indices.ravel().tolist(), distances.ravel().tolist()
    ([1, 0, 1], [1.0, 1.0, 2.0])
    """
    distances = model_distances(embeddings, metric=metric)
    n_models = len(distances)
    if k > n_models - 1:
        raise ValueError(f"k={k} neighbours asked for, but only {n_models} models")
    np.fill_diagonal(distances, np.inf)
    indices = np.argsort(distances, axis=1, kind="stable")[:, :k]
    return indices, np.take_along_axis(distances, indices, axis=1)


def _close_pairs(distances, threshold):
    """Pairs ``i < j`` with ``distances[i, j] < threshold``, closest first."""
    first, second = np.triu_indices(len(distances), k=1)
    close = distances[first, second] < threshold
    pairs = pd.DataFrame(
        {
            "first": first[close],
            "second": second[close],
            "distance": distances[first, second][close],
        }
    )
    return pairs.sort_values(
        ["distance", "first", "second"], kind="stable", ignore_index=True
    )


def _threshold(threshold, metric, default):
    """Return the threshold given, or the Euclidean default (cosine has none)."""
    if threshold is not None:
        return float(threshold)
    if metric != "euclidean":
        raise ValueError(
            f"threshold=None has a default for metric='euclidean' only; give a "
            f"threshold for metric={metric!r}"
        )
    return default


@validate_params(
    {"embeddings": ["array-like"], "threshold": _THRESHOLD + [None], "metric": _METRIC},
    prefer_skip_nested_validation=True,
)
def find_duplicates(embeddings, threshold=None, *, metric="euclidean"):
    """Pairs of models whose embeddings nearly coincide.

    Read more in the :ref:`User Guide <duplicates>`.

    Parameters
    ----------
    embeddings : array-like of shape (n_models, embedding_dim)
    threshold : float or None, default=None
        Pairs closer than this are reported. ``None`` is 1e-4 for the Euclidean
        metric, in the units of ``LocusEmbedder`` embeddings (the median distance
        between two training models is 1). On the Open LLM Leaderboard models it
        flags every pair whose train-query evaluations are identical and few
        others, mostly models that answer alike (:ref:`duplicates`); for looser
        near-duplicates raise it, watching how far the flagged pairs'
        scores differ. The cosine metric needs an explicit threshold.
    metric : {"euclidean", "cosine"}, default="euclidean"

    Returns
    -------
    pandas.DataFrame
        Columns ``first``, ``second`` (model indices, ``first < second``) and
        ``distance``, closest pair first.

    Examples
    --------
    >>> from sklocus.geometry import find_duplicates
    >>> find_duplicates([[0, 0], [0, 0.00005], [1, 0]])
       first  second  distance
    0      0       1   0.00005
    """
    threshold = _threshold(threshold, metric, DUPLICATE_THRESHOLD)
    return _close_pairs(model_distances(embeddings, metric=metric), threshold)


@validate_params(
    {
        "embedder": _EMBEDDER,
        "evaluation_sets": "no_validation",
        "n_evals": _COUNT,
        "n_resamples": _COUNT,
        "threshold": _THRESHOLD + [None],
        "metric": _METRIC,
        "random_state": ["random_state"],
    },
    prefer_skip_nested_validation=True,
)
def stable_duplicates(
    embedder,
    evaluation_sets,
    n_evals,
    *,
    n_resamples=5,
    threshold=None,
    metric="euclidean",
    random_state=None,
):
    """Pairs that stay near-duplicates across resampled evaluation subsets.

    The fingerprint test of the paper: each model is embedded ``n_resamples`` times,
    each time from ``n_evals`` of its evaluations drawn afresh; a pair is reported
    when it is closer than ``threshold`` in every resample. Each resample draws the
    same queries for every model as far as their sets allow
    (``subsample(..., shared=True)``), so two models that answer alike stay alike,
    while a pair that looked alike on one subset by chance does not survive.

    Read more in the :ref:`User Guide <duplicates>`.

    Parameters
    ----------
    embedder : fitted LocusEmbedder
    evaluation_sets : sequence of mappings
        One mapping from query to score per model.
    n_evals : int
        Evaluations per model in each resample (a smaller set is used whole).
    n_resamples : int, default=5
        Independent resamples.
    threshold : float or None, default=None
        Largest distance of a duplicate pair, in every resample. ``None`` is 3e-4
        for the Euclidean metric (in the units of ``LocusEmbedder`` embeddings;
        measured with ``n_evals=128`` on the Open LLM Leaderboard data,
        :doc:`/research/results`); the cosine metric needs an explicit threshold.
    metric : {"euclidean", "cosine"}, default="euclidean"
    random_state : int, RandomState instance or None, default=None
        Seeds the resampling.

    Returns
    -------
    pandas.DataFrame
        Columns ``first``, ``second`` and ``distance`` (the largest over the
        resamples), closest pair first.
    """
    threshold = _threshold(threshold, metric, STABLE_DUPLICATE_THRESHOLD)
    rng = check_random_state(random_state)
    worst = None
    for _ in range(n_resamples):
        drawn = subsample(evaluation_sets, n_evals, random_state=rng, shared=True)
        distances = model_distances(embedder.transform(drawn), metric=metric)
        worst = distances if worst is None else np.maximum(worst, distances)
    return _close_pairs(worst, threshold)


@validate_params(
    {
        "embeddings": ["array-like"],
        "n_clusters": _COUNT + [None],
        "distance_threshold": _THRESHOLD + [None],
        "metric": _METRIC,
    },
    prefer_skip_nested_validation=True,
)
def cluster_models(
    embeddings, n_clusters=None, *, distance_threshold=None, metric="euclidean"
):
    """Hierarchical clustering of models (average linkage), e.g. into families.

    Give exactly one of ``n_clusters`` and ``distance_threshold``.

    Read more in the :ref:`User Guide <families>`.

    Parameters
    ----------
    embeddings : array-like of shape (n_models, embedding_dim)
    n_clusters : int, default=None
        Number of clusters to cut the tree into.
    distance_threshold : float, default=None
        Cut the tree where clusters are farther apart than this (average distance).
    metric : {"euclidean", "cosine"}, default="euclidean"

    Returns
    -------
    labels : ndarray of shape (n_models,), int
        Cluster of each model, numbered from 0.
    linkage : ndarray of shape (n_models - 1, 4)
        The linkage matrix, for :func:`scipy.cluster.hierarchy.dendrogram`.

    Examples
    --------
    >>> from sklocus.geometry import cluster_models
    >>> labels, linkage = cluster_models([[0, 1], [0.1, 1], [1, 0], [1, 0.1]],
    ...                                  n_clusters=2)
    >>> labels.tolist(), linkage.shape
    ([0, 0, 1, 1], (3, 4))
    """
    if (n_clusters is None) == (distance_threshold is None):
        raise ValueError("give exactly one of n_clusters and distance_threshold")
    distances = model_distances(embeddings, metric=metric)
    n_models = len(distances)
    if n_models < 2:
        raise ValueError(
            f"embeddings hold {n_models} model(s); clustering needs at least two"
        )
    np.fill_diagonal(distances, 0.0)
    linkage = hierarchy.linkage(
        squareform((distances + distances.T) / 2, checks=False), method="average"
    )
    if n_clusters is not None:
        if n_clusters > n_models:
            raise ValueError(f"n_clusters={n_clusters} must lie in [1, {n_models}]")
        raw = hierarchy.fcluster(linkage, n_clusters, criterion="maxclust")
    else:
        raw = hierarchy.fcluster(
            linkage, float(distance_threshold), criterion="distance"
        )
    # Number clusters in order of first appearance, so labels read naturally.
    _, first = np.unique(raw, return_index=True)
    order = {cluster: rank for rank, cluster in enumerate(raw[np.sort(first)])}
    return np.array([order[c] for c in raw]), linkage


@validate_params(
    {
        "profile": [Mapping],
        "queries_by_benchmark": [Mapping],
        "n": _COUNT,
        "random_state": ["random_state"],
    },
    prefer_skip_nested_validation=True,
)
def profile_evaluation_set(profile, queries_by_benchmark, n=128, random_state=None):
    """Build a synthetic evaluation set with given success rates per benchmark.

    ``n`` evaluations are spread as evenly as possible over the benchmarks of
    ``profile``; in each benchmark, queries are drawn without replacement and
    ``round(accuracy * n_benchmark)`` of them, at random, get score 1.

    Read more in the :ref:`User Guide <profile_search>`.

    Parameters
    ----------
    profile : mapping of benchmark to float
        Desired accuracy on each benchmark, in [0, 1].
    queries_by_benchmark : mapping of benchmark to sequence
        The queries available in each benchmark.
    n : int, default=128
        Evaluations in the set.
    random_state : int, RandomState instance or None, default=None

    Returns
    -------
    dict
        ``{query: score}``.

    Examples
    --------
    >>> from sklocus.geometry import profile_evaluation_set
    >>> queries = {"math": [f"m{i}" for i in range(50)],
    ...            "code": [f"c{i}" for i in range(50)]}
    >>> evaluations = profile_evaluation_set({"math": 0.25, "code": 1.0}, queries,
    ...                                      n=40, random_state=0)
    >>> sum(s for q, s in evaluations.items() if q[0] == "m")
    5.0
    """
    if not profile:
        raise ValueError("profile must be a non-empty mapping {benchmark: accuracy}")
    if n < len(profile):
        raise ValueError(
            f"n={n!r} must be at least one evaluation per benchmark ({len(profile)})"
        )
    rng = check_random_state(random_state)
    shares = np.full(len(profile), n // len(profile))
    shares[: n % len(profile)] += 1
    evaluations = {}
    for (benchmark, accuracy), size in zip(profile.items(), shares):
        if benchmark not in queries_by_benchmark:
            raise ValueError(f"benchmark {benchmark!r} has no queries")
        if not isinstance(accuracy, numbers.Real) or not 0 <= accuracy <= 1:
            raise ValueError(
                f"benchmark {benchmark!r} has accuracy {accuracy!r}; expected a "
                "number in [0, 1]"
            )
        queries = as_item_list(
            queries_by_benchmark[benchmark], f"queries of benchmark {benchmark!r}"
        )
        if size > len(queries):
            raise ValueError(
                f"benchmark {benchmark!r} has {len(queries)} queries but the profile "
                f"needs {size}"
            )
        chosen = rng.choice(len(queries), size=size, replace=False)
        correct = np.zeros(size)
        correct[rng.permutation(size)[: int(round(accuracy * size))]] = 1.0
        evaluations.update(
            (queries[i], float(score)) for i, score in zip(chosen, correct)
        )
    return evaluations


@validate_params(
    {
        "embedder": _EMBEDDER,
        "profile": [Mapping],
        "queries_by_benchmark": [Mapping],
        "embeddings": ["array-like"],
        "k": _COUNT,
        "n": _COUNT,
        "metric": _METRIC,
        "random_state": ["random_state"],
    },
    prefer_skip_nested_validation=True,
)
def search_by_profile(
    embedder,
    profile,
    queries_by_benchmark,
    embeddings,
    k=10,
    *,
    n=128,
    metric="euclidean",
    random_state=None,
):
    """Find the real models nearest to a desired capability profile.

    Synthesises an evaluation set with the profile's per-benchmark accuracies
    (:func:`profile_evaluation_set`), embeds it and returns the nearest models.

    Read more in the :ref:`User Guide <profile_search>`.

    Parameters
    ----------
    embedder : fitted LocusEmbedder
    profile : mapping of benchmark to float
        Desired accuracy on each benchmark.
    queries_by_benchmark : mapping of benchmark to sequence
        Queries of each benchmark, understood by the embedder's query encoder.
    embeddings : array-like of shape (n_models, embedding_dim)
        The real models.
    k : int, default=10
        How many models to return.
    n : int, default=128
        Evaluations in the synthetic set.
    metric : {"euclidean", "cosine"}, default="euclidean"
    random_state : int, RandomState instance or None, default=None

    Returns
    -------
    indices : ndarray of shape (k,)
        The nearest models, nearest first.
    distances : ndarray of shape (k,)
    """
    embeddings = check_embeddings(embeddings)
    evaluations = profile_evaluation_set(profile, queries_by_benchmark, n, random_state)
    target = embedder.transform([evaluations])
    distances = model_distances(embeddings, target, metric=metric)[:, 0]
    order = np.argsort(distances, kind="stable")[:k]
    return order, distances[order]


@validate_params(
    {"embeddings": ["array-like"], "score_matrix": ["array-like"], "metric": _METRIC},
    prefer_skip_nested_validation=True,
)
def disagreement_correlation(embeddings, score_matrix, *, metric="euclidean"):
    """How well embedding distance tracks behavioural disagreement between models.

    For every pair of models with at least one query observed for both, the rate
    at which their 0/1 scores (``score >= 0.5``) differ on those common queries is
    set against their embedding distance.

    Read more in the :ref:`User Guide <distances>`.

    Parameters
    ----------
    embeddings : array-like of shape (n_models, embedding_dim)
    score_matrix : array-like of shape (n_queries, n_models)
        Observed scores, NaN where unobserved (see
        :func:`sklocus.evaluations.to_matrix`).
    metric : {"euclidean", "cosine"}, default="euclidean"

    Returns
    -------
    dict
        ``pearson``, ``spearman`` and ``kendall`` correlation coefficients, and
        ``n_pairs``, the number of pairs compared.
    """
    distances = model_distances(embeddings, metric=metric)
    scores = np.asarray(score_matrix, dtype=np.float64)
    if scores.ndim != 2 or scores.shape[1] != len(distances):
        raise ValueError(
            f"score_matrix has shape {scores.shape}; expected (n_queries, "
            f"{len(distances)}), one column per model"
        )
    scores = scores.T  # a model per row, as the distances are
    observed = ~np.isnan(scores)
    correct = np.where(observed, scores >= 0.5, False).astype(np.float64)
    wrong = (observed & ~(scores >= 0.5)).astype(np.float64)
    common = observed.astype(np.float64) @ observed.T.astype(np.float64)
    disagreements = correct @ wrong.T + wrong @ correct.T
    first, second = np.triu_indices(len(distances), k=1)
    keep = common[first, second] > 0
    if keep.sum() < 3:
        raise ValueError("fewer than three model pairs share an observed query")
    first, second = first[keep], second[keep]
    rate = disagreements[first, second] / common[first, second]
    distance = distances[first, second]
    return {
        "pearson": float(stats.pearsonr(distance, rate).statistic),
        "spearman": float(stats.spearmanr(distance, rate).statistic),
        "kendall": float(stats.kendalltau(distance, rate).statistic),
        "n_pairs": int(len(rate)),
    }
