"""How well sklocus predicts correctness and routes queries.

Score matrices are ``(n_models, n_queries)``, NaN where a model was not evaluated on
a query; probabilities have the same shape. :func:`get_scorer` turns the
correctness measures into scorers for ``GridSearchCV`` and ``cross_val_score``.
"""

from __future__ import annotations

import numpy as np
from sklearn.metrics import roc_auc_score

__all__ = [
    "best_models",
    "correctness_accuracy",
    "correctness_brier_score",
    "correctness_log_likelihood",
    "correctness_roc_auc",
    "get_scorer",
    "routing_accuracy",
]


def _check_pair(scores, probabilities):
    scores = np.asarray(scores, dtype=np.float64)
    probabilities = np.asarray(probabilities, dtype=np.float64)
    if scores.shape != probabilities.shape:
        raise ValueError(
            f"scores have shape {scores.shape} but probabilities have shape "
            f"{probabilities.shape}; both must be (n_models, n_queries)"
        )
    return scores, probabilities


def _observed_pairs(scores, probabilities, measure):
    """Return the observed scores and their probabilities as two flat arrays."""
    scores, probabilities = _check_pair(scores, probabilities)
    observed = ~np.isnan(scores)
    if not observed.any():
        raise ValueError(f"no score is observed; {measure} is undefined")
    return scores[observed], probabilities[observed]


def correctness_accuracy(scores, probabilities):
    """Agreement of thresholded predictions with observed scores.

    A prediction is ``probability >= 0.5``, an observed label ``score >= 0.5``; the
    accuracy is taken over every observed (model, query) pair.

    Read more in the :ref:`User Guide <held_out_metrics>`.

    Parameters
    ----------
    scores : array-like of shape (n_models, n_queries)
        Observed scores, NaN where unobserved.
    probabilities : array-like of shape (n_models, n_queries)
        Predicted probabilities of a correct answer.

    Returns
    -------
    float

    Examples
    --------
    >>> from sklocus.metrics import correctness_accuracy
    >>> correctness_accuracy([[1, 0, float("nan")]], [[0.9, 0.7, 0.1]])
    0.5
    """
    scores, probabilities = _observed_pairs(
        scores, probabilities, "correctness accuracy"
    )
    return float(((probabilities >= 0.5) == (scores >= 0.5)).mean())


# Probabilities are clipped to [_EPS, 1 - _EPS] so that a confident mistake costs a
# large finite amount; float32 probabilities round to 0 and 1 beyond about 1e-7.
_EPS = 1e-7


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
    scores : array-like of shape (n_models, n_queries)
        Observed scores in [0, 1], NaN where unobserved.
    probabilities : array-like of shape (n_models, n_queries)
        Predicted probabilities of a correct answer.

    Returns
    -------
    float

    Examples
    --------
    >>> from sklocus.metrics import correctness_log_likelihood
    >>> round(correctness_log_likelihood([[1, 0, float("nan")]], [[0.5, 0.5, 0.1]]), 3)
    -0.693
    """
    s, p = _observed_pairs(scores, probabilities, "the log-likelihood")
    p = np.clip(p, _EPS, 1 - _EPS)
    return float(np.mean(s * np.log(p) + (1 - s) * np.log1p(-p)))


def correctness_brier_score(scores, probabilities):
    """Mean squared difference between the observed scores and the probabilities.

    A proper scoring rule like :func:`correctness_log_likelihood` but bounded: 0 is
    perfect, lower is better, 0.25 is what predicting 0.5 everywhere earns.

    Read more in the :ref:`User Guide <held_out_metrics>`.

    Parameters
    ----------
    scores : array-like of shape (n_models, n_queries)
        Observed scores in [0, 1], NaN where unobserved.
    probabilities : array-like of shape (n_models, n_queries)
        Predicted probabilities of a correct answer.

    Returns
    -------
    float

    Examples
    --------
    >>> from sklocus.metrics import correctness_brier_score
    >>> float(correctness_brier_score([[1, 0, float("nan")]], [[0.5, 0.5, 0.1]]))
    0.25
    """
    s, p = _observed_pairs(scores, probabilities, "the Brier score")
    return float(np.mean((p - s) ** 2))


def correctness_roc_auc(scores, probabilities):
    """Area under the ROC curve of the probabilities against correct answers.

    A correct answer is ``score >= 0.5``. It measures ranking only: how often a
    correct (model, query) pair gets a higher probability than an incorrect one.

    Read more in the :ref:`User Guide <held_out_metrics>`.

    Parameters
    ----------
    scores : array-like of shape (n_models, n_queries)
        Observed scores in [0, 1], NaN where unobserved.
    probabilities : array-like of shape (n_models, n_queries)
        Predicted probabilities of a correct answer.

    Returns
    -------
    float

    Examples
    --------
    >>> from sklocus.metrics import correctness_roc_auc
    >>> correctness_roc_auc([[1, 0, 1]], [[0.9, 0.2, 0.1]])
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


def get_scorer(name):
    """Return a scorer of predicted correctness, by a scikit-learn scorer name.

    scikit-learn's own scorer strings need a 2-D ``X`` and labels ``y``, which
    neither :class:`~sklocus.LocusEmbedder` nor :class:`~sklocus.LocusRouter`
    takes; these scorers give the same names their meaning here. For a
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
    if name not in _SCORERS:
        raise ValueError(
            f"unknown scorer {name!r}; sklocus.metrics.get_scorer knows "
            f"{', '.join(map(repr, _SCORERS))}"
        )
    return _CorrectnessScorer(name)


# Utilities this close to a query's best count as tied with it. A set embedded in
# another batch, or a row in another place of a GPU matrix product, rounds
# differently, so an exact copy of a model can score a few float32 ulps above the
# original (seen on the CPU and on an H200).
TIE_TOLERANCE = 1e-6


def best_models(utilities):
    """Choose the model each query is routed to: the one rule every router follows.

    The model of highest utility (a probability of a correct answer, less any
    cost); near-ties, utilities within ``TIE_TOLERANCE`` (1e-6) of the best, go to
    the model listed first, so that float rounding never decides a route.
    :meth:`sklocus.LocusRouter.predict`, :func:`routing_accuracy` and the model
    map all choose this way.

    Read more in the :ref:`User Guide <choosing_a_model>`.

    Parameters
    ----------
    utilities : array-like of shape (n_models, n_queries)
        Each model's utility for each query; ``-inf`` rules a model out.

    Returns
    -------
    ndarray of shape (n_queries,), int
        The row of the chosen model for each query.

    Examples
    --------
    >>> from sklocus.metrics import best_models
    >>> best_models([[0.9, 0.6, 0.5], [0.2, 0.7, 0.5 + 1e-9]])
    array([0, 1, 0])
    """
    utilities = np.asarray(utilities, dtype=np.float64)
    if utilities.ndim != 2 or utilities.shape[0] == 0:
        raise ValueError(
            f"utilities have shape {utilities.shape}; expected (n_models, n_queries) "
            "with at least one model"
        )
    best = utilities.max(axis=0, keepdims=True)
    return np.argmax(utilities >= best - TIE_TOLERANCE, axis=0)


def routing_accuracy(scores, probabilities):
    """Mean observed score of the model each query is routed to.

    Each query goes to the model of highest predicted probability, near-ties to
    the one listed first (:func:`best_models`). Queries whose chosen model was not
    evaluated on them are left out.

    Read more in the :ref:`User Guide <held_out_metrics>`.

    Parameters
    ----------
    scores : array-like of shape (n_models, n_queries)
        Observed scores, NaN where unobserved.
    probabilities : array-like of shape (n_models, n_queries)
        Predicted probabilities of a correct answer.

    Returns
    -------
    float

    Examples
    --------
    >>> from sklocus.metrics import routing_accuracy
    >>> routing_accuracy([[1, 0], [0, 1]], [[0.9, 0.6], [0.2, 0.4]])
    0.5
    """
    scores, probabilities = _check_pair(scores, probabilities)
    chosen = scores[best_models(probabilities), np.arange(scores.shape[1])]
    observed = ~np.isnan(chosen)
    if not observed.any():
        raise ValueError(
            "no query's chosen model has an observed score; routing accuracy is "
            "undefined"
        )
    return float(chosen[observed].mean())
