"""The pool calibration stage: LOCUS's logits fitted to the pool's own evaluations.

With ``calibration="pool"`` (or ``"pool+isotonic"``, ``"pool+sigmoid"``) a
router fits one slope for the pool's logits and one offset per model on
held-out predictions of the pool's evaluations (the model is in
:mod:`sklocus._calibration`), and maps LOCUS's probabilities through them before
the other stages.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from sklocus._calibration import apply_calibration, fit_calibration, fit_new_offsets
from sklocus._router._stage import Stage


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
