"""The exploration stage: route by draws or upper bounds of LOCUS's logits.

A router that learns from the outcomes of its own routes (``exploration=``)
moves LOCUS's logits before the other stages apply: by a draw from each logit's
Gaussian (``"thompson"``) or to its upper bound (``"ucb"``), the standard
deviations coming from the Laplace approximation of each embedding's refinement
(:mod:`sklocus.nn.uncertainty`). The probabilities a router returns stay its
best guesses; only the routes move.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
from sklearn.utils import check_random_state

from sklocus._groups import logits
from sklocus._router._locus import locus_given
from sklocus._router._stage import Stage, placed
from sklocus.nn.uncertainty import logit_stds, posterior_factors


def check_exploration(router):
    """Refuse ``exploration`` with an embedder whose uncertainty is unknown."""
    if router.exploration is None:
        return
    if not locus_given(router):
        raise ValueError(
            f"exploration={router.exploration!r} needs a LocusEmbedder, whose "
            f"embeddings it knows the uncertainty of; got a "
            f"{type(router.embedder).__name__}"
        )


class _Factors:
    """The pool's Laplace factors once computed: a cache, shared by copies."""

    def __init__(self, factors=None):
        self.factors = factors


@dataclasses.dataclass(frozen=True, eq=False)
class Exploration(Stage):
    """A fitted router's exploration: the random state of its draws, its factors.

    Nothing of it is fitted or saved: the random state is made at ``fit``,
    load and unpickling (:meth:`start`), and the router's copies share it, so
    that a served router's snapshots draw on, not afresh; each model's Laplace
    factors are computed on the first route that explores, and kept.

    Parameters
    ----------
    rng : numpy.random.RandomState
        ``"thompson"``'s draws.
    cache : _Factors
    """

    rng: np.random.RandomState
    cache: _Factors = dataclasses.field(default_factory=_Factors)

    @classmethod
    def start(cls, random_state):
        """Return a fresh exploration: draws seeded by the router's ``random_state``."""
        return cls(check_random_state(random_state))

    def with_rows(self, indices, rows):
        factors = rows.get("factors")
        if self.cache.factors is None or factors is None:
            return Exploration(self.rng)  # computed again when next needed
        factors = placed(self.cache.factors, factors, indices)
        return Exploration(self.rng, _Factors(factors))

    def without_rows(self, kept):
        if self.cache.factors is None:
            return Exploration(self.rng)
        return Exploration(
            self.rng, _Factors(self.cache.factors[torch.as_tensor(kept)])
        )

    def cached(self):
        """Whether the pool's factors are computed (and so kept up to date)."""
        return self.cache.factors is not None

    def move(self, probabilities, vectors, locus, pool_sets, mode, strength):
        """Move the pool's LOCUS probabilities as ``exploration`` says.

        ``locus`` holds the pool's embeddings; ``pool_sets()`` gives the sets
        they were refined on (for the factors, when not yet computed);
        ``mode`` and ``strength`` are the router's ``exploration`` and
        ``exploration_strength``.
        """
        inner = locus.inner
        predictor = inner.net_.module_.predictor
        with torch.no_grad():
            projected = predictor.project_query(
                torch.as_tensor(vectors, device=inner.device_)
            )
            z = torch.as_tensor(
                locus.embeddings * np.float32(inner.embedding_scale_),
                device=inner.device_,
            )
        stds = logit_stds(predictor, z, self.factors(locus, pool_sets), projected)
        moves = strength * stds.cpu().numpy().astype(np.float64)
        if mode == "thompson":
            moves = moves * self.rng.standard_normal(moves.shape)
        found = logits(probabilities) + moves
        return (1.0 / (1.0 + np.exp(-found))).astype(np.float32)

    def factors(self, locus, pool_sets):
        """Each model's Laplace factors, computed on first use and kept.

        ``locus`` holds the pool's embeddings, ``pool_sets()`` gives the sets
        they were refined on.
        """
        if self.cache.factors is None:
            self.cache.factors = self.posterior_factors(
                locus, locus.embeddings, pool_sets()
            )
        return self.cache.factors

    def posterior_factors(self, locus, embeddings, ragged):
        """Laplace covariance factors of ``embeddings``, refined on ``ragged``."""
        inner = locus.inner
        predictor = inner.net_.module_.predictor
        used, codes = np.unique(ragged.query_codes, return_inverse=True)
        vectors = inner._encode([ragged.queries[i] for i in used.tolist()])
        with torch.no_grad():
            projected = predictor.project_query(
                torch.as_tensor(vectors, device=inner.device_)
            )
        bounds = ragged.offsets.tolist()
        rows = [
            torch.as_tensor(codes[a:b], device=inner.device_)
            for a, b in zip(bounds[:-1], bounds[1:])
        ]
        z = torch.as_tensor(
            embeddings * np.float32(inner.embedding_scale_), device=inner.device_
        )
        return posterior_factors(predictor, z, projected, rows, inner.refine_penalty)
