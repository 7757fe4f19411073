"""What a few evaluations say about a model: a posterior over reference models.

A new model is described by the reference models it resembles. Each reference
model ``j`` is a LOCUS embedding, and the predictor gives its P(correct)
``p[j, q]`` on any query. A model's evaluations ``(q_i, y_i)`` weight the
reference models by their (tempered) likelihood,

    log w[j] = temperature * sum_i y_i log p[j, q_i] + (1 - y_i) log(1 - p[j, q_i]),

so that with no evaluation every reference model counts alike, and with many only
those that explain them remain. The weights give:

- the model's expected score on a group of queries it was not evaluated on, and
  its variance: the weighted spread of the reference models' expected scores
  (what is not known about the model) plus their Bernoulli variance (what is
  not known about the outcomes);
- which queries to evaluate next: those whose outcome is expected to shrink the
  variance of the groups' scores most (:func:`greedy_variance_reduction`).

Everything here is plain numpy on arrays of predictions; the estimator in
:mod:`sklocus._score_estimation` computes the predictions and checks the input.
"""

from __future__ import annotations

import numpy as np

# Predictions are clipped this far from 0 and 1 before taking their logarithm, so
# that one surprising outcome cannot rule a reference model out entirely.
_EPS = 1e-4


def posterior_weights(predictions, scores, temperature, exclude=None):
    """Weights of the reference models given one model's evaluations.

    Parameters
    ----------
    predictions : ndarray of shape (n_reference, n_evaluations)
        Each reference model's P(correct) on the evaluated queries.
    scores : ndarray of shape (n_evaluations,)
        The model's scores in [0, 1].
    temperature : float
        Multiplies the log-likelihood; below 1 it keeps more reference models in.
    exclude : int, default=None
        A reference model given no weight (the model itself, when it is one).

    Returns
    -------
    ndarray of shape (n_reference,), float64, summing to 1
    """
    p = np.clip(predictions.astype(np.float64), _EPS, 1 - _EPS)
    y = np.asarray(scores, dtype=np.float64)
    log_w = temperature * (np.log(p) @ y + np.log1p(-p) @ (1 - y))
    if exclude is not None:
        log_w[exclude] = -np.inf
    log_w -= log_w.max()
    w = np.exp(log_w)
    return w / w.sum()


def group_sums(outcomes, predictions, group_codes, n_groups):
    """Each reference model's correct count per group, and its Bernoulli variance.

    Parameters
    ----------
    outcomes : ndarray of shape (n_reference, n_queries)
        Each reference model's score where it was evaluated, its P(correct)
        elsewhere: what the counts add up.
    predictions : ndarray of shape (n_reference, n_queries)
        Its P(correct) everywhere: how uncertain each outcome is.
    group_codes : ndarray of shape (n_queries,), int
        Each query's group, in ``range(n_groups)``.
    n_groups : int

    Returns
    -------
    means, variances : ndarray of shape (n_reference, n_groups), float64
    """
    p = predictions.astype(np.float64)
    onehot = np.zeros((len(group_codes), n_groups))
    onehot[np.arange(len(group_codes)), group_codes] = 1.0
    return outcomes.astype(np.float64) @ onehot, (p * (1 - p)) @ onehot


def group_moments(weights, means, variances):
    """Mean and variance of a model's correct count per group under the weights.

    Parameters
    ----------
    weights : ndarray of shape (n_reference,)
    means, variances : ndarray of shape (n_reference, n_groups)
        Each reference model's expected count and its Bernoulli variance over the
        queries not evaluated (as :func:`group_sums` gives them).

    Returns
    -------
    mean, variance : ndarray of shape (n_groups,)
        Variance is the spread of the reference models' expected counts plus their
        mean Bernoulli variance (the law of total variance).
    """
    mean = weights @ means
    spread = weights @ (means - mean) ** 2
    return mean, spread + weights @ variances


def greedy_variance_reduction(weights, predictions, targets, n_choices, noise=None):
    """Choose queries whose outcomes shrink the variance of the targets most.

    A Gaussian approximation of the weighted reference models: the outcome of
    query ``q`` is its P(correct) ``p_q`` plus Bernoulli noise of variance
    ``E[p_q (1 - p_q)]``, and observing it shrinks the variance of target ``t``
    by ``Cov(p_q, t)^2 / (Var(p_q) + noise_q)``. Each pick conditions every
    covariance on the outcomes chosen before it, so a batch does not spend two
    evaluations on what one of them tells (what one query says about a model's
    vector, another that behaves alike says again).

    Parameters
    ----------
    weights : ndarray of shape (n_reference,)
    predictions : ndarray of shape (n_reference, n_candidates)
        P(correct) of each reference model on each candidate query, or its
        observed outcome there.
    targets : ndarray of shape (n_reference, n_targets)
        Each reference model's value of each target (a group's expected score),
        scaled so that the targets' variances are comparable.
    n_choices : int
        At most ``n_candidates``.
    noise : ndarray of shape (n_candidates,), default=None
        The variance of each candidate's outcome around ``predictions``; default
        ``E[p (1 - p)]`` under the weights, which is 0 where ``predictions``
        are observed outcomes (0 or 1): the outcome is then a draw from the
        weighted outcomes, whose spread is its whole variance.

    Returns
    -------
    ndarray of shape (n_choices,), int
        Positions in the candidates, in the order chosen; ties go to the first.
    """
    w = weights.astype(np.float64)
    root = np.sqrt(w)[:, None]
    p = predictions.astype(np.float64)
    centred = root * (p - w @ p)
    target = root * (targets - w @ targets)
    cross = centred.T @ target  # Cov(p_q, t), (n_candidates, n_targets)
    variance = (centred**2).sum(axis=0)  # Var(p_q)
    noise = w @ (p * (1 - p)) if noise is None else np.asarray(noise, np.float64)
    taken = np.zeros(p.shape[1], dtype=bool)
    past = []  # the rank-one corrections of the covariance so far
    chosen = []
    for _ in range(n_choices):
        denominator = np.maximum(variance + noise, 1e-12)
        gain = (cross**2).sum(axis=1) / denominator
        gain[taken] = -np.inf
        q = int(np.argmax(gain))
        chosen.append(q)
        taken[q] = True
        covariance = centred.T @ centred[:, q]
        for u in past:
            covariance -= u * u[q]
        u = covariance / np.sqrt(denominator[q])
        past.append(u)
        variance = np.maximum(variance - u**2, 0.0)
        cross = cross - np.outer(u, cross[q] / np.sqrt(denominator[q]))
    return np.asarray(chosen, dtype=np.int64)
