"""The query heads stage: each model's own logistic regression on the encodings.

On a small pool each model's evaluations are what a team has most of, so a
router fits each model a head on the query encodings of its evaluations and
blends its logits with LOCUS's, one blend weight for the pool chosen on
held-out halves (the model is in :mod:`sklocus._query_heads`).
"""

from __future__ import annotations

import numpy as np

from sklocus._embedder import _SMALL_POOL
from sklocus._query_heads import apply_heads, fit_heads
from sklocus._router._locus import locus_given, sorted_order

# The router's fitted attributes of this stage: per model, then pool-wide.
ATTRIBUTES = ("head_weights_", "head_biases_", "head_blends_", "head_blend_")


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


def unseen_logits(scorer, queries, scores, vectors, model_offsets):
    """LOCUS's logits on the queries its network never trained on, or None.

    Returns ``(unseen, logits)``: which of ``queries`` are the embedder's
    ``validation_queries_``, and each model's logits on them from an embedding
    of its other evaluations (NaN elsewhere, and for a model with no other
    evaluation); None when the embedder has none of them.
    """
    locus = scorer.locus
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
    found[np.ix_(rows, np.flatnonzero(embedded))] = scorer.locus_logits(
        locus.embed([s for s in sets if s], report=False), offsets, vectors[rows]
    )
    return unseen, found


class QueryHeads:
    """Each model's head (``head_weights_``, ``head_biases_``, ``head_blends_``).

    Parameters
    ----------
    blend : float
        The pool's weight of the heads against LOCUS (``head_blend_``).
    """

    def __init__(self, blend):
        self.blend = blend

    @classmethod
    def of(cls, router):
        """Return the stage a fitted router holds, or None."""
        if getattr(router, "head_weights_", None) is None:
            return None
        return cls(router.head_blend_)

    @classmethod
    def fit(cls, scorer, embeddings, model_offsets, queries, scores):
        """Fit the pool's heads and blend on the stages before (``scorer``).

        Returns the stage, the heads ``(weights, biases, blends)`` and each
        head's out-of-fold logit of each evaluation (NaN where none).
        """
        *heads, held_out, blend = _fit(
            scorer, embeddings, model_offsets, queries, scores, None
        )
        return cls(blend), tuple(heads), held_out

    def fit_models(self, scorer, embeddings, model_offsets, queries, scores):
        """Heads ``(weights, biases, blends)`` of models under the pool's blend."""
        return _fit(scorer, embeddings, model_offsets, queries, scores, self.blend)[:3]

    def write(self, router, heads):
        router.head_weights_, router.head_biases_, router.head_blends_ = heads
        router.head_blend_ = self.blend

    def transform(self, probabilities, rows, vectors):
        """LOCUS's probabilities blended with the heads of ``rows``."""
        if rows.heads is None:
            return probabilities
        return apply_heads(probabilities, vectors, *rows.heads)


def _fit(scorer, embeddings, model_offsets, queries, scores, blend):
    """:func:`~sklocus._query_heads.fit_heads` on the pool's encodings and logits."""
    vectors = scorer.locus.encode(queries)
    locus = scorer.locus_logits(embeddings, model_offsets, vectors)
    order = np.array(sorted_order(queries), dtype=int)
    observed = ~np.isnan(scores)

    def rows_of(j):
        return order[observed[order, j]]

    blend_on = None
    if blend is None:
        blend_on = unseen_logits(scorer, queries, scores, vectors, model_offsets)
    return fit_heads(vectors, scores, locus, rows_of, blend, blend_on)
