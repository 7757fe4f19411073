"""The pool calibration stage: LOCUS's logits fitted to the pool's own evaluations.

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

With ``calibration="pool"`` (or ``"pool+isotonic"``, ``"pool+sigmoid"``) a
router maps LOCUS's probabilities through them before the other stages. The
halves are :mod:`._halves`'.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from scipy.optimize import minimize

from sklocus._groups import logits
from sklocus._router._stage import Stage

# Prior precision of each model's offset around the pool's, in units of the log
# loss summed over its held-out evaluations (as group_shrinkage).
OFFSET_SHRINKAGE = 3.0
# Prior precision of the slope around 1 and the pool's offset around 0: a pool
# with few evaluations keeps LOCUS's predictions nearly as they are.
PRIOR = 1.0
# Newton steps of a new model's offset (a one-dimensional convex problem).
_NEWTON_STEPS = 25


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


@dataclasses.dataclass(frozen=True, eq=False)
class PoolCalibration(Stage):
    """One slope for the pool's logits, and each model's offset.

    Parameters
    ----------
    slope, intercept : float
        The router's ``calibration_slope_`` and ``calibration_intercept_``.
    offsets : ndarray of shape (n_models,), float32, or None
        The router's ``model_offsets_``.
    """

    slope: float
    intercept: float
    offsets: np.ndarray | None = None

    ATTRIBUTES = {
        "calibration_slope_": "slope",
        "calibration_intercept_": "intercept",
        "model_offsets_": "offsets",
    }
    ROWS = ("offsets",)

    @classmethod
    def fit(cls, locus, queries, scores, halves):
        """Fit on the pool, embedded as ``locus`` holds it.

        ``scores`` is ``(n_queries, n_models)``, NaN where unobserved;
        ``halves`` is :meth:`~sklocus._router._locus.Locus.half_embeddings`'.
        """
        held = locus.held_out_logits(queries, scores, halves)
        levels = locus.levels(locus.embeddings, queries, scores)
        return cls(*fit_calibration(*held, levels))

    def fit_rows(self, locus, embeddings, queries, scores):
        """Offsets of models, embedded as ``embeddings``, under the pool's fit.

        ``scores`` is ``(n_queries, n_models)``, NaN where unobserved.
        """
        halves = locus.half_embeddings(queries, scores, embeddings.shape[1])
        held = locus.held_out_logits(queries, scores, halves)
        levels = locus.levels(embeddings, queries, scores)
        return {"offsets": fit_new_offsets(*held, levels, self.slope, self.intercept)}

    def transform(self, probabilities, vectors=None):
        """Calibrate the probabilities ``(n_queries, n_models)`` of the models."""
        if self.offsets is None:
            return probabilities
        return apply_calibration(probabilities, self.slope, self.offsets)
