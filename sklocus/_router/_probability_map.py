"""The probability map stage: one increasing map, so that 0.8 comes true 8 in 10.

With ``calibration="isotonic"`` or ``"sigmoid"`` a router maps its probabilities
through a :class:`~sklocus.calibration.ProbabilityCalibrator` fitted on the
pool's own evaluations, each predicted as the stages before predict it from an
embedding of the other half of its model's evaluations (and, with query heads,
by heads fitted on the other fold).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from sklocus._groups import logits
from sklocus._router._halves import in_both_halves
from sklocus._router._locus import chunks
from sklocus._router._stage import Stage
from sklocus.calibration import ProbabilityCalibrator


@dataclasses.dataclass(frozen=True, eq=False)
class ProbabilityMap(Stage):
    """The router's ``probability_calibrator_``, applied to every prediction.

    Parameters
    ----------
    calibrator : ProbabilityCalibrator
    """

    calibrator: ProbabilityCalibrator

    ATTRIBUTES = {"probability_calibrator_": "calibrator"}

    @classmethod
    def fit(cls, method, stages, queries, scores, halves, head_held_out=None):
        """Fit on the pool's held-out predictions by the stages before it.

        ``halves`` is :meth:`~sklocus._router._locus.Locus.half_embeddings`';
        ``head_held_out``, with query heads, is each head's out-of-fold logits.
        """
        held_out = _held_out_logits(stages, queries, scores, halves)
        if head_held_out is not None:
            blends = stages.heads.blends[None, :].astype(np.float64)
            blended = (1.0 - blends) * held_out + blends * head_held_out
            held_out = np.where(np.isnan(head_held_out), held_out, blended)
        usable = ~np.isnan(held_out)
        calibrator = ProbabilityCalibrator(method).fit(
            1.0 / (1.0 + np.exp(-np.where(usable, held_out, 0.0))),
            np.where(usable, scores, np.nan),
        )
        return cls(calibrator)

    def transform(self, probabilities, vectors=None):
        return self.calibrator.predict(probabilities)


def _held_out_logits(stages, queries, scores, halves):
    """Return the stages' held-out logits ``(n_queries, n_models)``, NaN where none.

    Each observed pair is predicted from the embedding of the other half of its
    model's evaluations, with the pool calibration's offsets when fitted (the
    query heads, fitted on every evaluation, are left out).
    """
    half, embeddings = halves
    both = in_both_halves(half)
    calibration = stages.calibration
    offsets = None if calibration is None else calibration.offsets
    out = np.full(scores.shape, np.nan)
    for h in (0, 1):
        others = stages.for_models(embeddings[h], offsets)
        for rows in chunks(len(queries)):
            found = others.probabilities(queries[rows])
            wanted = (half[rows] == 1 - h) & both[None, :]
            out[rows][wanted] = logits(found)[wanted]
    return out
