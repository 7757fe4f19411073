"""Pool calibration: fit LOCUS's logits to the pool's own held-out evaluations.

A router knows every pool model's evaluations, so it can check LOCUS against them
before routing: each model's evaluations are split in two halves, each half is
predicted from an embedding of the other, and on these held-out logits ``l`` the
router fits

    logit' = c_m + a + d_m + b * (l - mean of l over the model's half),
    d_m ~ N(0, 1 / shrinkage),    (b, a) ~ N((1, 0), 1 / prior)

by MAP with ``b >= 0``, where ``c_m`` is the model's own level by LOCUS (its mean
logit on its evaluated queries). One slope ``b`` for the pool says how far LOCUS's
differences between queries hold on the pool's queries: about 1 or more on the kinds
of query its embedder was trained on (where refined logits are under-confident),
well below 1 on a benchmark it never saw, where each model's predictions fall back
towards its level. The offsets ``a + d_m`` correct the levels as the pool's
evaluations say, ``d_m`` shrunk to 0 where a model has few. Predictions are then
``(1 - b) c_m + a + d_m + b * logit``: one offset per model and the slope.

The split is fixed by each set's queries, so a model gets the same halves whatever
pool it is in and whatever order its evaluations come in.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import minimize

from sklocus._groups import logits

# Prior precision of each model's offset around the pool's, in units of the log
# loss summed over its held-out evaluations (as group_shrinkage).
OFFSET_SHRINKAGE = 3.0
# Prior precision of the slope around 1 and the pool's offset around 0: a pool
# with few evaluations keeps LOCUS's predictions nearly as they are.
PRIOR = 1.0
# Newton steps of a new model's offset (a one-dimensional convex problem).
_NEWTON_STEPS = 25


def split_halves(observed, rank):
    """Assign each observed (query, model) pair to half 0 or 1.

    Parameters
    ----------
    observed : ndarray of bool, shape (n_queries, n_models)
    rank : ndarray of int, shape (n_queries,)
        Each query's place in an order that does not depend on the order given
        (:func:`sklocus.evaluations.query_sort_key`), so that the halves do not.

    Returns
    -------
    ndarray of int8, shape (n_queries, n_models)
        0 or 1 for observed pairs, -1 elsewhere. A model with one evaluation has
        it in half 0 and nothing to hold out.
    """
    half = np.full(observed.shape, -1, dtype=np.int8)
    for j in range(observed.shape[1]):
        rows = np.flatnonzero(observed[:, j])
        rows = rows[np.argsort(rank[rows], kind="stable")]
        order = np.random.default_rng(len(rows)).permutation(len(rows))
        half[rows, j] = 0
        half[rows[order[len(rows) // 2 :]], j] = 1 if len(rows) > 1 else 0
    return half


def in_both_halves(half):
    """Mask of the models with evaluations in both halves, shape ``(n_models,)``."""
    return (half == 0).any(axis=0) & (half == 1).any(axis=0)


def _spread(held_logits, models, halves):
    """Held-out logits less their mean over the same model and half.

    Each half's embedding has a level of its own, and a half that went better than
    the model's whole set leaves a worse one to predict: that complement would pull
    the slope below what LOCUS's order of the queries earns. Within a half, only the
    order counts.
    """
    x = np.asarray(held_logits, dtype=np.float64)
    cell = 2 * np.asarray(models) + np.asarray(halves)
    size = int(cell.max()) + 1 if len(cell) else 0
    counts = np.bincount(cell, minlength=size)
    means = np.bincount(cell, x, size) / np.maximum(counts, 1)
    return x - means[cell]


def fit_calibration(held_logits, scores, models, halves, levels):
    """MAP slope, pool offset and model offsets from held-out logits.

    Parameters
    ----------
    held_logits, scores : ndarray of shape (n_pairs,)
        LOCUS's held-out logit and the observed score of each pair.
    models, halves : ndarray of int, shape (n_pairs,)
        The model of each pair, and the half it was predicted from.
    levels : ndarray of shape (n_models,)
        Each model's level ``c_m``.

    Returns
    -------
    slope : float
    intercept : float
        The pool's offset ``a``, with which new models start.
    offsets : ndarray of shape (n_models,), float32
        ``(1 - b) c_m + a + d_m``, added to ``b`` times a logit.
    """
    y = np.asarray(scores, dtype=np.float64)
    levels = np.asarray(levels, dtype=np.float64)
    n_models = len(levels)
    if not len(y):
        return 1.0, 0.0, np.zeros(n_models, dtype=np.float32)
    level = levels[models]
    spread = _spread(held_logits, models, halves)

    def loss_and_gradient(theta):
        slope, intercept, deviation = theta[0], theta[1], theta[2:]
        z = level + intercept + deviation[models] + slope * spread
        residual = 1.0 / (1.0 + np.exp(-z)) - y
        loss = (
            np.sum(np.logaddexp(0.0, z) - y * z)
            + 0.5 * OFFSET_SHRINKAGE * np.sum(deviation**2)
            + 0.5 * PRIOR * ((slope - 1.0) ** 2 + intercept**2)
        )
        gradient = np.empty_like(theta)
        gradient[0] = residual @ spread + PRIOR * (slope - 1.0)
        gradient[1] = residual.sum() + PRIOR * intercept
        gradient[2:] = (
            np.bincount(models, residual, n_models) + OFFSET_SHRINKAGE * deviation
        )
        return loss, gradient

    start = np.zeros(n_models + 2)
    start[0] = 1.0
    # The slope stays >= 0: at 0 each model is predicted at its level, and a
    # negative slope would turn LOCUS's order of the queries upside down.
    bounds = [(0.0, None)] + [(None, None)] * (n_models + 1)
    theta = minimize(
        loss_and_gradient, start, jac=True, method="L-BFGS-B", bounds=bounds
    ).x
    slope, intercept = float(theta[0]), float(theta[1])
    # The offsets again, each model alone under the pool's slope and offset: the
    # optimum the joint fit reached within its tolerance, computed exactly as a
    # new model's is, so the same evaluations give the same offset.
    offsets = fit_new_offsets(held_logits, y, models, halves, levels, slope, intercept)
    return slope, intercept, offsets


def fit_new_offsets(held_logits, scores, models, halves, levels, slope, intercept):
    """Offsets of new models under the pool's fitted slope and offset.

    The arguments are as :func:`fit_calibration`'s; returns ``(n_models,)`` float32.
    Each model's ``d_m`` is a one-dimensional convex problem: Newton steps solve
    them all.
    """
    levels = np.asarray(levels, dtype=np.float64)
    base = levels[models] + intercept + slope * _spread(held_logits, models, halves)
    y = np.asarray(scores, dtype=np.float64)
    deviation = np.zeros(len(levels))
    for _ in range(_NEWTON_STEPS):
        p = 1.0 / (1.0 + np.exp(-(base + deviation[models])))
        gradient = (
            np.bincount(models, p - y, len(levels)) + OFFSET_SHRINKAGE * deviation
        )
        curvature = np.bincount(models, p * (1 - p), len(levels)) + OFFSET_SHRINKAGE
        deviation -= gradient / curvature
    return ((1.0 - slope) * levels + intercept + deviation).astype(np.float32)


def apply_calibration(probabilities, slope, offsets):
    """Calibrated probabilities, shape ``(n_queries, n_models)``, float32."""
    shifted = offsets[None, :] + slope * logits(probabilities)
    return (1.0 / (1.0 + np.exp(-shifted))).astype(np.float32)


def held_out_pairs(predict, scores, half, chunk):
    """Held-out logits of every observed pair, predicted from the other half.

    Parameters
    ----------
    predict : callable
        ``predict(h, rows)`` gives the probabilities, shape ``(len(rows),
        n_models)``, of every model embedded from its half ``h`` on the queries
        ``rows``.
    scores : ndarray of shape (n_queries, n_models)
    half : ndarray of shape (n_queries, n_models)
        From :func:`split_halves`.
    chunk : int
        Queries predicted at once.

    Returns
    -------
    held_logits, targets, models, halves : ndarray of shape (n_pairs,)
        Over the pairs of models with evaluations in both halves; ``halves`` is
        the half each pair was predicted from.
    """
    both = in_both_halves(half)
    rows = np.flatnonzero((half >= 0)[:, both].any(axis=1))
    none = np.zeros(0, dtype=np.int64)
    found = [(np.zeros(0), np.zeros(0), none, none)]
    for start in range(0, len(rows), chunk):
        block = rows[start : start + chunk]
        for h in (0, 1):
            # Pairs of the other half, predicted from the embedding of half h.
            local, models = np.nonzero((half[block] == 1 - h) & both[None, :])
            if not len(local):
                continue
            predicted = logits(predict(h, block))
            found.append(
                (
                    predicted[local, models],
                    scores[block[local], models],
                    models,
                    np.full(len(models), h),
                )
            )
    return tuple(np.concatenate(column) for column in zip(*found))
