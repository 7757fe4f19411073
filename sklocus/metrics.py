"""How well sklocus predicts correctness and routes queries.

Score matrices are ``(n_queries, n_models)``, a row per query as ``Y`` of
:meth:`LocusRouter.fit <sklocus.LocusRouter.fit>` and a column per model, NaN where
a model was not evaluated on a query; probabilities have the same shape, as
``predict_correctness`` returns them. :func:`get_scorer` turns the
correctness measures into scorers for ``GridSearchCV`` and ``cross_val_score``.
"""

from __future__ import annotations

import numbers

import numpy as np
from sklearn.metrics import roc_auc_score

from sklocus._cost_quality import (
    aiq,
    cost_at_quality,
    cost_quality_curve,
    quality_at_cost,
    quality_cost_frontier,
)

# TIE_TOLERANCE, which best_models' documentation names, stays importable here.
from sklocus._routing import (  # noqa: F401
    TIE_TOLERANCE,
    best_models,
    cost_utilities,
    threshold_utilities,
)
from sklocus._sklearn_compat import Interval, StrOptions, validate_params

__all__ = [
    "aiq",
    "best_models",
    "correctness_accuracy",
    "correctness_brier_score",
    "correctness_log_likelihood",
    "correctness_roc_auc",
    "cost_at_quality",
    "cost_quality_curve",
    "cost_utilities",
    "expected_calibration_error",
    "get_scorer",
    "quality_at_cost",
    "quality_cost_frontier",
    "reliability_curve",
    "routing_accuracy",
    "threshold_utilities",
]


def _check_pair(scores, probabilities):
    scores = np.asarray(scores, dtype=np.float64)
    probabilities = np.asarray(probabilities, dtype=np.float64)
    if scores.shape != probabilities.shape:
        raise ValueError(
            f"scores have shape {scores.shape} but probabilities have shape "
            f"{probabilities.shape}; both must be (n_queries, n_models)"
        )
    return scores, probabilities


def _observed_pairs(scores, probabilities, measure):
    """Return the observed scores and their probabilities as two flat arrays."""
    scores, probabilities = _check_pair(scores, probabilities)
    observed = ~np.isnan(scores)
    if not observed.any():
        raise ValueError(f"no score is observed; {measure} is undefined")
    return scores[observed], probabilities[observed]


@validate_params(
    {"scores": ["array-like"], "probabilities": ["array-like"]},
    prefer_skip_nested_validation=True,
)
def correctness_accuracy(scores, probabilities):
    """Agreement of thresholded predictions with observed scores.

    A prediction is ``probability >= 0.5``, an observed label ``score >= 0.5``; the
    accuracy is taken over every observed (model, query) pair.

    Read more in the :ref:`User Guide <held_out_metrics>`.

    Parameters
    ----------
    scores : array-like of shape (n_queries, n_models)
        Observed scores, NaN where unobserved.
    probabilities : array-like of shape (n_queries, n_models)
        Predicted probabilities of a correct answer.

    Returns
    -------
    float

    Examples
    --------
    >>> from sklocus.metrics import correctness_accuracy
    >>> correctness_accuracy([[1], [0], [float("nan")]], [[0.9], [0.7], [0.1]])
    0.5
    """
    scores, probabilities = _observed_pairs(
        scores, probabilities, "correctness accuracy"
    )
    return float(((probabilities >= 0.5) == (scores >= 0.5)).mean())


# Probabilities are clipped to [_EPS, 1 - _EPS] so that a confident mistake costs a
# large finite amount; float32 probabilities round to 0 and 1 beyond about 1e-7.
_EPS = 1e-7


@validate_params(
    {"scores": ["array-like"], "probabilities": ["array-like"]},
    prefer_skip_nested_validation=True,
)
def correctness_log_likelihood(scores, probabilities):
    """Mean log-likelihood of the observed scores under the predicted probabilities.

    ``s * log(p) + (1 - s) * log(1 - p)`` averaged over every observed (model,
    query) pair, so fractional scores count as soft labels. It is a proper scoring
    rule: higher is better, 0 is perfect, ``log(0.5)`` (about -0.693) is what
    predicting 0.5 everywhere earns. Unlike :func:`correctness_accuracy` it
    rewards calibrated probabilities, not only their side of 0.5.

    Read more in the :ref:`User Guide <held_out_metrics>`.

    Parameters
    ----------
    scores : array-like of shape (n_queries, n_models)
        Observed scores in [0, 1], NaN where unobserved.
    probabilities : array-like of shape (n_queries, n_models)
        Predicted probabilities of a correct answer.

    Returns
    -------
    float

    Examples
    --------
    >>> from sklocus.metrics import correctness_log_likelihood
    >>> nan = float("nan")
    >>> round(correctness_log_likelihood([[1], [0], [nan]], [[0.5], [0.5], [0.1]]), 3)
    -0.693
    """
    s, p = _observed_pairs(scores, probabilities, "the log-likelihood")
    p = np.clip(p, _EPS, 1 - _EPS)
    return float(np.mean(s * np.log(p) + (1 - s) * np.log1p(-p)))


@validate_params(
    {"scores": ["array-like"], "probabilities": ["array-like"]},
    prefer_skip_nested_validation=True,
)
def correctness_brier_score(scores, probabilities):
    """Mean squared difference between the observed scores and the probabilities.

    A proper scoring rule like :func:`correctness_log_likelihood` but bounded: 0 is
    perfect, lower is better, 0.25 is what predicting 0.5 everywhere earns.

    Read more in the :ref:`User Guide <held_out_metrics>`.

    Parameters
    ----------
    scores : array-like of shape (n_queries, n_models)
        Observed scores in [0, 1], NaN where unobserved.
    probabilities : array-like of shape (n_queries, n_models)
        Predicted probabilities of a correct answer.

    Returns
    -------
    float

    Examples
    --------
    >>> from sklocus.metrics import correctness_brier_score
    >>> nan = float("nan")
    >>> float(correctness_brier_score([[1], [0], [nan]], [[0.5], [0.5], [0.1]]))
    0.25
    """
    s, p = _observed_pairs(scores, probabilities, "the Brier score")
    return float(np.mean((p - s) ** 2))


@validate_params(
    {"scores": ["array-like"], "probabilities": ["array-like"]},
    prefer_skip_nested_validation=True,
)
def correctness_roc_auc(scores, probabilities):
    """Area under the ROC curve of the probabilities against correct answers.

    A correct answer is ``score >= 0.5``. It measures ranking only: how often a
    correct (model, query) pair gets a higher probability than an incorrect one.

    Read more in the :ref:`User Guide <held_out_metrics>`.

    Parameters
    ----------
    scores : array-like of shape (n_queries, n_models)
        Observed scores in [0, 1], NaN where unobserved.
    probabilities : array-like of shape (n_queries, n_models)
        Predicted probabilities of a correct answer.

    Returns
    -------
    float

    Examples
    --------
    >>> from sklocus.metrics import correctness_roc_auc
    >>> correctness_roc_auc([[1], [0], [1]], [[0.9], [0.2], [0.1]])
    0.5
    """
    s, p = _observed_pairs(scores, probabilities, "the ROC AUC")
    correct = s >= 0.5
    if correct.all() or not correct.any():
        raise ValueError(
            "every observed score is on one side of 0.5; the ROC AUC needs both "
            "correct and incorrect answers"
        )
    return float(roc_auc_score(correct, p))


# scikit-learn's scorer names, for the correctness measure each means here. Each
# is "greater is better", as scikit-learn's scorers are.
_SCORERS = {
    "neg_log_loss": correctness_log_likelihood,
    "neg_brier_score": lambda s, p: -correctness_brier_score(s, p),
    "roc_auc": correctness_roc_auc,
    "accuracy": correctness_accuracy,
}


class _CorrectnessScorer:
    """Score an estimator by how well it predicts held-out or observed scores."""

    def __init__(self, name):
        self.name = name

    def __call__(self, estimator, X, y=None):
        pairs = getattr(estimator, "_correctness_pairs", None)
        if pairs is None:
            raise TypeError(
                f"the {self.name!r} scorer of sklocus.metrics scores a LocusEmbedder "
                f"or a LocusRouter; got {type(estimator).__name__}"
            )
        return _SCORERS[self.name](*pairs(X, y))

    def __repr__(self):
        return f"sklocus.metrics.get_scorer({self.name!r})"


@validate_params(
    {"name": [StrOptions(set(_SCORERS))]}, prefer_skip_nested_validation=True
)
def get_scorer(name):
    """Return a scorer of predicted correctness, by a scikit-learn scorer name.

    scikit-learn's own scorer strings need a 2-D ``X`` and labels ``y``, which
    neither :class:`~sklocus.LocusEmbedder` nor :class:`~sklocus.LocusRouter`
    takes (:ref:`scoring_strings` says what each string does instead); these
    scorers give the same names their meaning here. For a
    ``LocusEmbedder`` they score the held-out quarter of each evaluation set, as
    :meth:`LocusEmbedder.score <sklocus.LocusEmbedder.score>` does; for a
    ``LocusRouter`` ``scorer(router, queries, Y)`` scores
    ``predict_correctness(queries)`` against every observed score of ``Y``.

    Read more in the :ref:`User Guide <choosing_settings>`.

    Parameters
    ----------
    name : {"neg_log_loss", "neg_brier_score", "roc_auc", "accuracy"}
        ``"neg_log_loss"`` is :func:`correctness_log_likelihood` (the embedder's
        default score), ``"neg_brier_score"`` minus :func:`correctness_brier_score`,
        ``"roc_auc"`` :func:`correctness_roc_auc` and ``"accuracy"``
        :func:`correctness_accuracy`. Greater is better for each.

    Returns
    -------
    callable
        ``scorer(estimator, X, y=None)``, for ``scoring=`` of ``GridSearchCV``,
        ``cross_val_score`` or ``cross_validate`` (alone or in a dict).

    Examples
    --------
    >>> from sklocus.metrics import get_scorer
    >>> get_scorer("neg_brier_score")
    sklocus.metrics.get_scorer('neg_brier_score')
    """
    return _CorrectnessScorer(name)


@validate_params(
    {
        "scores": ["array-like"],
        "probabilities": ["array-like"],
        "sample_weight": ["array-like", None],
    },
    prefer_skip_nested_validation=True,
)
def routing_accuracy(scores, probabilities, *, sample_weight=None):
    """Mean observed score of the model each query is routed to.

    Each query goes to the model of highest predicted probability, near-ties to
    the one listed first (:func:`best_models`). Queries whose chosen model was not
    evaluated on them are left out. Every routing accuracy sklocus reports (the
    router's ``score``, the model map, ``sklocus fit``, ``route`` and ``report``
    with ``--test-queries``, the demo) is this function's.

    Read more in the :ref:`User Guide <held_out_metrics>`.

    Parameters
    ----------
    scores : array-like of shape (n_queries, n_models)
        Observed scores, NaN where unobserved.
    probabilities : array-like of shape (n_queries, n_models)
        Predicted probabilities of a correct answer, or any utility to route by
        (``-inf`` rules a model out).
    sample_weight : array-like of shape (n_queries,), default=None
        Weights of the queries.

    Returns
    -------
    float

    Examples
    --------
    >>> from sklocus.metrics import routing_accuracy
    >>> routing_accuracy([[1, 0], [0, 1]], [[0.9, 0.2], [0.6, 0.4]])
    0.5
    """
    scores, probabilities = _check_pair(scores, probabilities)
    chosen = scores[np.arange(len(scores)), best_models(probabilities)]
    observed = ~np.isnan(chosen)
    if not observed.any():
        raise ValueError(
            "no query's chosen model has an observed score; routing accuracy is "
            "undefined"
        )
    weights = None
    if sample_weight is not None:
        weights = np.asarray(sample_weight, dtype=np.float64)
        if weights.shape != chosen.shape:
            raise ValueError(
                f"sample_weight has shape {weights.shape}; give one weight per "
                f"query ({len(chosen)})"
            )
        weights = weights[observed]
    return float(np.average(chosen[observed], weights=weights))


# The arguments of the binned calibration measures.
_BINNED = {
    "scores": ["array-like"],
    "probabilities": ["array-like"],
    "n_bins": [Interval(numbers.Integral, 1, None, closed="left")],
    "strategy": [StrOptions({"uniform", "quantile"})],
}


@validate_params(_BINNED, prefer_skip_nested_validation=True)
def reliability_curve(scores, probabilities, *, n_bins=10, strategy="uniform"):
    """Observed score against predicted probability, bin by bin.

    The pairs of observed scores and predictions are binned by prediction; for a
    calibrated predictor each bin's mean score equals its mean prediction. Like
    :func:`sklearn.calibration.calibration_curve`, for score matrices with gaps
    and with each bin's count, which :func:`expected_calibration_error` weighs by.

    Read more in the :ref:`User Guide <routing_on_a_budget>`.

    Parameters
    ----------
    scores : array-like of shape (n_queries, n_models)
        Observed scores in [0, 1], NaN where unobserved.
    probabilities : array-like of shape (n_queries, n_models)
        Predicted probabilities of a correct answer.
    n_bins : int, default=10
        Number of bins.
    strategy : {"uniform", "quantile"}, default="uniform"
        Bins of equal width over [0, 1], or holding equal numbers of pairs.

    Returns
    -------
    predicted : ndarray of shape (n_nonempty,)
        Mean prediction of each non-empty bin.
    observed : ndarray of shape (n_nonempty,)
        Mean observed score of each non-empty bin.
    counts : ndarray of shape (n_nonempty,), int
        Pairs in each non-empty bin.

    Examples
    --------
    >>> from sklocus.metrics import reliability_curve
    >>> predicted, observed, counts = reliability_curve(
    ...     [[1], [0], [1], [1]], [[0.9], [0.1], [0.8], [0.3]], n_bins=2)
    >>> predicted.round(3).tolist(), observed.tolist(), counts.tolist()
    ([0.2, 0.85], [0.5, 1.0], [2, 2])
    """
    y, p = _observed_pairs(scores, probabilities, "a reliability curve")
    if strategy == "uniform":
        edges = np.linspace(0.0, 1.0, n_bins + 1)
    else:
        edges = np.quantile(p, np.linspace(0.0, 1.0, n_bins + 1))
    bins = np.clip(np.searchsorted(edges[1:-1], p, side="right"), 0, n_bins - 1)
    counts = np.bincount(bins, minlength=n_bins)
    kept = counts > 0
    predicted = np.bincount(bins, weights=p, minlength=n_bins)[kept] / counts[kept]
    observed = np.bincount(bins, weights=y, minlength=n_bins)[kept] / counts[kept]
    return predicted, observed, counts[kept]


@validate_params(_BINNED, prefer_skip_nested_validation=True)
def expected_calibration_error(scores, probabilities, *, n_bins=10, strategy="uniform"):
    """How far predictions are from the rates they predict, on average.

    ``ECE = sum over bins of (n_b / n) * |mean score_b - mean prediction_b|``,
    over the bins of :func:`reliability_curve`; 0 for a calibrated predictor.

    Read more in the :ref:`User Guide <routing_on_a_budget>`.

    Parameters
    ----------
    scores : array-like of shape (n_queries, n_models)
        Observed scores in [0, 1], NaN where unobserved.
    probabilities : array-like of shape (n_queries, n_models)
        Predicted probabilities of a correct answer.
    n_bins : int, default=10
    strategy : {"uniform", "quantile"}, default="uniform"

    Returns
    -------
    float

    Examples
    --------
    >>> from sklocus.metrics import expected_calibration_error
    >>> round(expected_calibration_error([[1], [0], [1], [1]],
    ...                                  [[0.9], [0.1], [0.8], [0.3]], n_bins=2), 3)
    0.225
    """
    predicted, observed, counts = reliability_curve(
        scores, probabilities, n_bins=n_bins, strategy=strategy
    )
    return float(np.sum(counts * np.abs(observed - predicted)) / counts.sum())
