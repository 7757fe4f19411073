"""The exploration stage: route by draws or upper bounds of LOCUS's logits.

A router that learns from the outcomes of its own routes (``exploration=``)
moves LOCUS's logits before the other stages apply: by a draw from each logit's
Gaussian (``"thompson"``) or to its upper bound (``"ucb"``), the standard
deviations coming from the Laplace approximation of each embedding's refinement
(:mod:`sklocus.nn.uncertainty`). The probabilities a router returns stay its
best guesses; only the routes move.
"""

from __future__ import annotations

import numpy as np
import torch
from sklearn.utils import check_random_state

from sklocus._groups import logits
from sklocus._router._locus import locus_given
from sklocus._sklearn_compat import validate_parameter_constraints
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


def reset(router):
    """Start a router's exploration afresh: no factors, draws seeded anew.

    At ``fit``, and when a router is loaded or unpickled: its copies (a served
    router's snapshots) then share one random state, and draw on from it.
    """
    router._exploration_cache = None
    router._exploration_rng = check_random_state(router.random_state)


class Exploration:
    """A fitted router's exploration: its moves, draws and cached factors.

    A view of the router: the factors (``_exploration_cache``, with the
    embeddings they are of) and the random state of the draws
    (``_exploration_rng``) are the router's, shared with its copies, so that a
    served router's snapshots draw on, not afresh.

    Parameters
    ----------
    router : LocusRouter
    locus : Locus
        LOCUS's predictions through the router's embedder.
    """

    def __init__(self, router, locus):
        self.router = router
        self.locus = locus

    def move(self, probabilities, vectors):
        """Move the pool's LOCUS probabilities as ``exploration`` says.

        The settings are checked here, at use, as ``fit`` checks them: one
        changed by ``set_params`` after the fit would otherwise route silently.
        """
        router, inner = self.router, self.locus.inner
        names = ("exploration", "exploration_strength")
        validate_parameter_constraints(
            {name: router._parameter_constraints[name] for name in names},
            {name: getattr(router, name) for name in names},
            caller_name=type(router).__name__,
        )
        predictor = inner.net_.module_.predictor
        with torch.no_grad():
            projected = predictor.project_query(
                torch.as_tensor(vectors, device=inner.device_)
            )
            z = torch.as_tensor(
                router.embeddings_ * np.float32(inner.embedding_scale_),
                device=inner.device_,
            )
        stds = logit_stds(predictor, z, self.factors(), projected)
        moves = router.exploration_strength * stds.cpu().numpy().astype(np.float64)
        if router.exploration == "thompson":
            moves = moves * self.draws().standard_normal(moves.shape)
        found = logits(probabilities) + moves
        return (1.0 / (1.0 + np.exp(-found))).astype(np.float32)

    def draws(self):
        """Return the random state of ``"thompson"``'s draws (see :func:`reset`)."""
        return self.router._exploration_rng

    def cached(self):
        """Whether the pool's exploration factors are computed and current."""
        router = self.router
        cache = getattr(router, "_exploration_cache", None)
        return (
            getattr(router, "exploration", None) is not None
            and cache is not None
            and cache[0] is router.embeddings_
        )

    def factors(self):
        """Each model's :func:`~sklocus.nn.uncertainty.posterior_factors`, cached."""
        router = self.router
        cache = getattr(router, "_exploration_cache", None)
        if not self.cached():
            models = np.arange(len(router.classes_))
            factors = self.posterior_factors(
                router.embeddings_, router._kept().ragged(models)[0]
            )
            cache = router._exploration_cache = (router.embeddings_, factors)
        return cache[1]

    def posterior_factors(self, embeddings, ragged):
        """Laplace covariance factors of ``embeddings``, refined on ``ragged``."""
        inner = self.locus.inner
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
