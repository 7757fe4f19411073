"""The pool calibration stage: LOCUS's logits fitted to the pool's own evaluations.

With ``calibration="pool"`` (or ``"pool+isotonic"``, ``"pool+sigmoid"``) a
router fits one slope for the pool's logits and one offset per model on
held-out predictions of the pool's evaluations (the model is in
:mod:`sklocus._calibration`), and maps LOCUS's probabilities through them before
the other stages.
"""

from __future__ import annotations

from sklocus._calibration import apply_calibration, fit_calibration, fit_new_offsets

# The router's fitted attributes of this stage: pool-wide, then per model.
ATTRIBUTES = ("calibration_slope_", "calibration_intercept_", "model_offsets_")


class PoolCalibration:
    """One slope for the pool's logits, and each model's offset (``model_offsets_``).

    Parameters
    ----------
    slope, intercept : float
        The router's ``calibration_slope_`` and ``calibration_intercept_``.
    """

    def __init__(self, slope, intercept):
        self.slope = slope
        self.intercept = intercept

    @classmethod
    def of(cls, router):
        """Return the stage a fitted router holds, or None."""
        if getattr(router, "model_offsets_", None) is None:
            return None
        return cls(router.calibration_slope_, router.calibration_intercept_)

    @classmethod
    def fit(cls, locus, embeddings, queries, scores, halves):
        """Fit on the pool; return the stage and each model's offset.

        ``scores`` is ``(n_queries, n_models)``, NaN where unobserved;
        ``halves`` is :meth:`~sklocus._router._locus.Locus.half_embeddings`'.
        """
        held = locus.held_out_logits(queries, scores, halves)
        levels = locus.levels(embeddings, queries, scores)
        slope, intercept, offsets = fit_calibration(*held, levels)
        return cls(slope, intercept), offsets

    def fit_models(self, locus, embeddings, queries, scores):
        """Offsets of models, embedded as ``embeddings``, under the pool's fit.

        ``scores`` is ``(n_queries, n_models)``, NaN where unobserved.
        """
        halves = locus.half_embeddings(queries, scores, embeddings.shape[1])
        held = locus.held_out_logits(queries, scores, halves)
        levels = locus.levels(embeddings, queries, scores)
        return fit_new_offsets(*held, levels, self.slope, self.intercept)

    def write(self, router, offsets):
        router.calibration_slope_ = self.slope
        router.calibration_intercept_ = self.intercept
        router.model_offsets_ = offsets

    def transform(self, probabilities, rows, vectors=None):
        """Calibrate the probabilities ``(n_queries, n_models)`` of ``rows``' models."""
        if rows.model_offsets is None:
            return probabilities
        return apply_calibration(probabilities, self.slope, rows.model_offsets)
