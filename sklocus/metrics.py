"""Correctness and routing accuracy (METHOD.md, Metrics) and correctness log-likelihood.

Score matrices are ``(n_models, n_queries)``, NaN where a model was not evaluated on
a query; probabilities have the same shape.
"""

from __future__ import annotations

import numpy as np

__all__ = ["correctness_accuracy", "correctness_log_likelihood", "routing_accuracy"]


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


def routing_accuracy(scores, probabilities):
    """Mean observed score of the model each query is routed to.

    Each query goes to the model of highest predicted probability. Queries whose
    chosen model was not evaluated on them are left out.

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
    chosen = scores[np.argmax(probabilities, axis=0), np.arange(scores.shape[1])]
    observed = ~np.isnan(chosen)
    if not observed.any():
        raise ValueError(
            "no query's chosen model has an observed score; routing accuracy is "
            "undefined"
        )
    return float(chosen[observed].mean())
