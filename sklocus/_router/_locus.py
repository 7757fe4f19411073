"""LOCUS's own predictions for a router: refined embeddings and their P(correct).

The first stage of every route: each model is embedded from its evaluations
(refined as the router's ``refine_steps`` says) and scored on the queries by the
embedder's correctness predictor. The other stages read LOCUS through
:class:`Locus`, which also gives what they are fitted on: the query encodings,
each model embedded from each half of its evaluations, and each model's level.
"""

from __future__ import annotations

import copy
import dataclasses
import warnings

import numpy as np
from sklearn.base import clone

from sklocus._embedder import LocusEmbedder
from sklocus._groups import logits
from sklocus._router._halves import held_out_pairs, in_both_halves, split_halves
from sklocus._router._stage import Stage
from sklocus._router._tables import is_fitted
from sklocus.evaluations import query_sort_key

# Queries are scored in chunks of this many, so that memory stays bounded
# however many queries come in.
QUERY_CHUNK = 8192


def chunks(n):
    """Return the slices of ``range(n)`` scored at once."""
    return [slice(start, start + QUERY_CHUNK) for start in range(0, n, QUERY_CHUNK)]


def sorted_order(queries):
    """Return ``queries``' indices in an order that does not depend on theirs."""
    keys = [query_sort_key(query) for query in queries]
    return sorted(range(len(keys)), key=keys.__getitem__)


def inner_locus(embedder):
    """Return the LocusEmbedder ``embedder`` is or wraps (frozen), or None."""
    inner = getattr(embedder, "estimator", embedder)
    return inner if isinstance(inner, LocusEmbedder) else None


def locus_given(router):
    """Whether the router's embedder (``None``: a ``LocusEmbedder()``) is LOCUS's."""
    return router.embedder is None or inner_locus(router.embedder) is not None


def fitted_embedder(embedder, evaluation_sets):
    """Return the router's ``embedder_``: ``embedder`` cloned and fitted, or frozen.

    ``None`` fits a ``LocusEmbedder()``; a fitted LocusEmbedder not wrapped in
    ``FrozenEstimator`` is trained again from scratch, with a warning.
    """
    embedder = LocusEmbedder() if embedder is None else embedder
    if isinstance(embedder, LocusEmbedder) and is_fitted(embedder):
        warnings.warn(
            "LocusRouter clones and refits its embedder, so this fitted "
            "LocusEmbedder is trained again from scratch; wrap it in "
            "sklearn.frozen.FrozenEstimator to route with it as it is",
            UserWarning,
            stacklevel=4,
        )
    return clone(embedder).fit(evaluation_sets, None)


@dataclasses.dataclass(frozen=True, eq=False)
class Locus(Stage):
    """LOCUS through a router's fitted embedder: the embeddings and their predictions.

    Parameters
    ----------
    embedder : LocusEmbedder or FrozenEstimator or other fitted embedder
        The router's ``embedder_``.
    embeddings : ndarray of shape (n_models, embedding_dim), float32, or None
        The router's ``embeddings_``, one row per model.
    refine_steps : int or None
        The router's ``refine_steps`` at the time of use, in place of a
        LocusEmbedder's own (a setting, not fitted).
    """

    embedder: object
    embeddings: np.ndarray | None = None
    refine_steps: int | None = None

    ATTRIBUTES = {"embedder_": "embedder", "embeddings_": "embeddings"}
    ROWS = ("embeddings",)

    @classmethod
    def fit(cls, embedder, evaluation_sets, refine_steps):
        """Fit the router's ``embedder`` (:func:`fitted_embedder`), embed the pool."""
        fitted = fitted_embedder(embedder, evaluation_sets)
        embeddings = cls(fitted, refine_steps=refine_steps).embed(evaluation_sets)
        return cls(fitted, embeddings, refine_steps)

    @property
    def inner(self):
        """The LocusEmbedder whose network and query encoder the stages reach into.

        None for another embedder.
        """
        return inner_locus(self.embedder)

    def embed(self, evaluation_sets, report=True):
        """Embeddings of models, refined as ``refine_steps`` says, float32.

        ``report=False`` embeds without the embedder's progress lines: the
        stages' embeddings from parts of each model's evaluations, which would
        otherwise repeat "Embedding models" and "Refining embeddings" for the
        same models within one fit (the router's caller reports the fit).
        """
        embedder = self.embedder
        quiet = not report and getattr(self.inner, "verbose", 0)
        if self.inner is not None and (self.refine_steps is not None or quiet):
            # A shallow copy shares the fitted network and leaves the user's
            # embedder (perhaps frozen, perhaps shared) as it was.
            embedder = copy.copy(self.inner)
            if self.refine_steps is not None:
                embedder.refine_steps = self.refine_steps
            if quiet:
                embedder.verbose = 0
        return np.asarray(embedder.transform(evaluation_sets), dtype=np.float32)

    def probabilities(self, embeddings, queries):
        """P(correct) ``(n_queries, n_models)`` of one chunk, by the embedder's API."""
        return self.embedder.predict_correctness(embeddings, queries)

    def encode(self, queries):
        """Encode ``queries``, a chunk at a time."""
        return np.concatenate(
            [self.inner._encode(queries[rows]) for rows in chunks(len(queries))]
        )

    def predict(self, embeddings, vectors):
        """P(correct) ``(n_queries, n_models)`` of one chunk of encoded queries."""
        embeddings = self.inner._check_embeddings(embeddings)
        return self.inner._predict(embeddings, vectors).T

    def half_embeddings(self, queries, scores, width):
        """Each model embedded from each half of its evaluations.

        Returns ``(half, embeddings)``: :func:`~._halves.split_halves`'
        assignment, and for halves 0 and 1 an ``(n_models, width)`` array
        (zeros for a model without evaluations in both halves).
        """
        rank = np.empty(len(queries), dtype=np.int64)
        rank[sorted_order(queries)] = np.arange(len(queries))
        half = split_halves(~np.isnan(scores), rank)
        both = in_both_halves(half)
        embeddings = []
        for h in (0, 1):
            sets = [
                {queries[i]: scores[i, j] for i in np.flatnonzero(half[:, j] == h)}
                for j in np.flatnonzero(both)
            ]
            z = np.zeros((scores.shape[1], width), np.float32)
            if sets:
                z[both] = self.embed(sets, report=False)
            embeddings.append(z)
        return half, embeddings

    def held_out_logits(self, queries, scores, halves):
        """Each model's evaluations predicted from an embedding of the other half.

        ``halves`` is :meth:`half_embeddings`' result. Returns
        :func:`~._halves.held_out_pairs`' arrays.
        """
        half, embeddings = halves

        def predict(h, rows):
            return self.probabilities(embeddings[h], [queries[i] for i in rows])

        return held_out_pairs(predict, scores, half, QUERY_CHUNK)

    def logits_on(self, embeddings, queries):
        """LOCUS's logits ``(n_queries, n_models)`` on every chunk of ``queries``."""
        found = np.empty((len(queries), len(embeddings)))
        for rows in chunks(len(queries)):
            found[rows] = logits(self.probabilities(embeddings, queries[rows]))
        return found

    def levels(self, embeddings, queries, scores):
        """Each model's mean LOCUS logit on the queries it was evaluated on."""
        observed = ~np.isnan(scores)
        found = self.logits_on(embeddings, queries)
        total = np.where(observed, found, 0.0).sum(axis=0)
        return total / np.maximum(observed.sum(axis=0), 1)
