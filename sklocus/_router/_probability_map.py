"""The probability map stage: one increasing map, so that 0.8 comes true 8 in 10.

With ``calibration="isotonic"`` or ``"sigmoid"`` a router maps its probabilities
through a :class:`~sklocus.calibration.ProbabilityCalibrator` fitted on the
pool's own evaluations, each predicted as the stages before predict it from an
embedding of the other half of its model's evaluations (and, with query heads,
by heads fitted on the other fold).
"""

from __future__ import annotations

import numpy as np

from sklocus._calibration import in_both_halves
from sklocus._groups import logits
from sklocus._router._locus import chunks
from sklocus._router._rows import ModelRows
from sklocus.calibration import ProbabilityCalibrator


class ProbabilityMap:
    """The router's ``probability_calibrator_``, applied to every prediction.

    Parameters
    ----------
    calibrator : ProbabilityCalibrator
    """

    def __init__(self, calibrator):
        self.calibrator = calibrator

    @classmethod
    def of(cls, router):
        """Return the stage a fitted router holds, or None."""
        calibrator = getattr(router, "probability_calibrator_", None)
        return None if calibrator is None else cls(calibrator)

    @classmethod
    def fit(cls, method, scorer, queries, scores, halves, model_offsets, heads=None):
        """Fit on the pool's held-out predictions by the stages before it.

        ``halves`` is :meth:`~sklocus._router._locus.Locus.half_embeddings`';
        ``heads``, with query heads, is ``(blends, held_out)``: each model's
        blend and each head's out-of-fold logits.
        """
        held_out = _held_out_logits(scorer, queries, scores, halves, model_offsets)
        if heads is not None:
            blends, head_held_out = heads
            blends = blends[None, :].astype(np.float64)
            blended = (1.0 - blends) * held_out + blends * head_held_out
            held_out = np.where(np.isnan(head_held_out), held_out, blended)
        usable = ~np.isnan(held_out)
        calibrator = ProbabilityCalibrator(method).fit(
            1.0 / (1.0 + np.exp(-np.where(usable, held_out, 0.0))),
            np.where(usable, scores, np.nan),
        )
        return cls(calibrator)

    def transform(self, probabilities, rows=None, vectors=None):
        return self.calibrator.predict(probabilities)


def _held_out_logits(scorer, queries, scores, halves, model_offsets):
    """Return the stages' held-out logits ``(n_queries, n_models)``, NaN where none.

    Each observed pair is predicted from the embedding of the other half of its
    model's evaluations, with the pool calibration's offsets when fitted.
    """
    half, embeddings = halves
    both = in_both_halves(half)
    out = np.full(scores.shape, np.nan)
    for rows in chunks(len(queries)):
        chunk = queries[rows]
        for h in (0, 1):
            found = scorer.probabilities(ModelRows(embeddings[h], model_offsets), chunk)
            wanted = (half[rows] == 1 - h) & both[None, :]
            out[rows][wanted] = logits(found)[wanted]
    return out
