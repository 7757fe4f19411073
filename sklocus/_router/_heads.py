"""The query heads stage: each model's own logistic regression on the encodings.

On a small pool each model's evaluations are what a team has most of, so a
router fits each model a head on the query encodings of its evaluations and
blends its logits with LOCUS's, one blend weight for the pool chosen on
held-out halves (the model is in :mod:`sklocus._query_heads`).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from sklocus._embedder import _SMALL_POOL
from sklocus._query_heads import apply_heads, fit_heads
from sklocus._router._locus import locus_given, sorted_order
from sklocus._router._stage import Stage


def heads_wanted(router, n_models):
    """Whether ``fit`` fits query heads for a pool of ``n_models``.

    Refuses ``query_heads=True`` with an embedder that has no query encoder.
    """
    if router.query_heads == "auto":
        wanted = n_models < _SMALL_POOL
    else:
        wanted = bool(router.query_heads)
    usable = locus_given(router)
    if wanted and not usable and router.query_heads is True:
        raise ValueError(
            "query_heads=True needs a LocusEmbedder, whose query encoder "
            f"encodes the queries; got a {type(router.embedder).__name__}"
        )
    return wanted and usable


def unseen_logits(stages, queries, scores, vectors, model_offsets):
    """LOCUS's logits on the queries its network never trained on, or None.

    Returns ``(unseen, logits)``: which of ``queries`` are the embedder's
    ``validation_queries_``, and each model's logits on them from an embedding
    of its other evaluations (NaN elsewhere, and for a model with no other
    evaluation); None when the embedder has none of them.
    """
    locus = stages.locus
    held_out = set(getattr(locus.inner, "validation_queries_", None) or ())
    unseen = np.array([query in held_out for query in queries], dtype=bool)
    if not unseen.any():
        return None
    observed = ~np.isnan(scores)
    sets = [
        {queries[i]: scores[i, j] for i in np.flatnonzero(observed[:, j] & ~unseen)}
        for j in range(scores.shape[1])
    ]
    embedded = np.array([bool(s) for s in sets])
    if not embedded.any():
        return None
    rows = np.flatnonzero(unseen)
    found = np.full(scores.shape, np.nan)
    offsets = None if model_offsets is None else model_offsets[embedded]
    others = stages.for_models(
        locus.embed([s for s in sets if s], report=False), offsets
    )
    found[np.ix_(rows, np.flatnonzero(embedded))] = others.locus_logits(vectors[rows])
    return unseen, found


@dataclasses.dataclass(frozen=True, eq=False)
class QueryHeads(Stage):
    """Each model's logistic regression on the encodings, blended with LOCUS.

    Parameters
    ----------
    blend : float
        The pool's weight of the heads against LOCUS (``head_blend_``).
    weights, biases, blends : ndarray, float32, or None
        Each model's head and blend (``head_weights_``, ``head_biases_``,
        ``head_blends_``): ``(n_models, query_dim)``, ``(n_models,)``,
        ``(n_models,)``.
    """

    blend: float
    weights: np.ndarray | None = None
    biases: np.ndarray | None = None
    blends: np.ndarray | None = None

    ATTRIBUTES = {
        "head_weights_": "weights",
        "head_biases_": "biases",
        "head_blends_": "blends",
        "head_blend_": "blend",
    }
    ROWS = ("weights", "biases", "blends")

    @classmethod
    def fit(cls, stages, queries, scores):
        """Fit the pool's heads and blend on the stages before (``stages``).

        Returns the stage and each head's out-of-fold logit of each evaluation
        (NaN where none).
        """
        locus, calibration = stages.locus, stages.calibration
        offsets = None if calibration is None else calibration.offsets
        *heads, held_out, blend = _fit(
            stages, locus.embeddings, offsets, queries, scores, None
        )
        return cls(blend, *heads), held_out

    def fit_rows(self, stages, embeddings, model_offsets, queries, scores):
        """Heads of models under the pool's blend (field to rows)."""
        heads = _fit(stages, embeddings, model_offsets, queries, scores, self.blend)
        return dict(zip(self.ROWS, heads[:3]))

    def transform(self, probabilities, vectors):
        """LOCUS's probabilities blended with the models' heads."""
        if self.weights is None:
            return probabilities
        return apply_heads(
            probabilities, vectors, self.weights, self.biases, self.blends
        )


def _fit(stages, embeddings, model_offsets, queries, scores, blend):
    """:func:`~sklocus._query_heads.fit_heads` on the pool's encodings and logits."""
    vectors = stages.locus.encode(queries)
    locus = stages.for_models(embeddings, model_offsets).locus_logits(vectors)
    order = np.array(sorted_order(queries), dtype=int)
    observed = ~np.isnan(scores)

    def rows_of(j):
        return order[observed[order, j]]

    blend_on = None
    if blend is None:
        blend_on = unseen_logits(stages, queries, scores, vectors, model_offsets)
    return fit_heads(vectors, scores, locus, rows_of, blend, blend_on)
