"""The smallest network and pool that exercise every code path, for quick tests."""

import pandas as pd

from sklocus import LocusEmbedder

# A LocusEmbedder that trains in about a second on TINY_POOL.
TINY_NETWORK = dict(
    embedding_dim=8,
    n_latents=4,
    n_layers=1,
    n_heads=2,
    predictor_hidden=8,
    encoder_sizes=(8, 32),
    max_epochs=1,
    epoch_size=1,
    random_state=0,
)
# A LocusEmbedder trained enough (a few seconds) that its models differ: what
# tests of refinement, learning and uncertainty need.
SMALL_NETWORK = dict(
    embedding_dim=16,
    n_latents=4,
    n_layers=1,
    n_heads=2,
    predictor_hidden=16,
    batch_size=4,
    epoch_size=64,
    max_epochs=3,
    validation_fraction=None,
    random_state=0,
)
# make_evaluations(**TINY_POOL): 12 models, 120 queries with 8-d vectors.
TINY_POOL = dict(
    n_models=12, n_queries=120, evals_per_model=(30, 80), query_dim=8, random_state=0
)


class CountingEmbedder(LocusEmbedder):
    """A LocusEmbedder that counts how often it is unpickled in this process."""

    loads = 0

    def __setstate__(self, state):
        CountingEmbedder.loads += 1
        super().__setstate__(state)


def long_table(data):
    """The evaluations of make_evaluations as a long table, sorted by model."""
    rows = [
        (name, query, score)
        for name, evaluations in zip(data.model_names, data.evaluation_sets)
        for query, score in evaluations.items()
    ]
    return pd.DataFrame(rows, columns=["model", "query", "score"])


def tiny_priced_router():
    """TINY_POOL and a router over it: costs, forward-pass embeddings.

    What the served-router tests route with: a frozen TINY_NETWORK embedder
    (``fit`` only embeds) and ``refine_steps=0``, so that routing takes
    milliseconds; each model's cost is its parameter count.

    Returns
    -------
    (Bunch, LocusRouter)
    """
    from sklearn.frozen import FrozenEstimator

    from sklocus import LocusRouter
    from sklocus.datasets import make_evaluations
    from sklocus.evaluations import to_matrix

    data = make_evaluations(**TINY_POOL)
    embedder = LocusEmbedder(query_encoder=data.encoder, **TINY_NETWORK).fit(
        data.evaluation_sets
    )
    scores, queries = to_matrix(data.evaluation_sets)
    Y = pd.DataFrame(scores, columns=data.model_names)
    router = LocusRouter(FrozenEstimator(embedder), refine_steps=0)
    return data, router.fit(queries, Y, cost=data.params_b)
