"""Exploration: routing by the uncertainty of each model's embedding."""

import numpy as np
import pandas as pd
import pytest
import torch
from sklearn.decomposition import PCA
from sklearn.frozen import FrozenEstimator
from tiny import SMALL_NETWORK

from sklocus import LocusEmbedder, LocusRouter
from sklocus.datasets import make_evaluations
from sklocus.nn.uncertainty import logit_stds, logits_and_gradients, posterior_factors


@pytest.fixture(scope="module")
def data():
    return make_evaluations(
        n_models=6, n_queries=300, evals_per_model=None, query_dim=8, random_state=4
    )


@pytest.fixture(scope="module")
def embedder(data):
    return LocusEmbedder(query_encoder=data.encoder, **SMALL_NETWORK).fit(
        data.evaluation_sets
    )


def _table(data, queries):
    return pd.DataFrame(
        {
            name: [evaluations.get(q, np.nan) for q in queries]
            for name, evaluations in zip(data.model_names, data.evaluation_sets)
        }
    )


def _factors(router):
    """The router's Laplace factors of its embeddings, as exploration caches them."""
    stages = router.stages_
    return stages.exploration.factors(stages.locus, router._pool_sets)


def _router(embedder, data, queries, **params):
    router = LocusRouter(
        FrozenEstimator(embedder), refine_steps=10, query_heads=False, **params
    )
    return router.fit(queries, _table(data, queries))


def test_the_closed_form_gradient_is_autograd_s(embedder, data):
    predictor = embedder.net_.module_.predictor
    torch.manual_seed(0)
    z = torch.randn(3, 16)
    projected = predictor.project_query(
        torch.as_tensor(data.encoder.transform(data.query_ids[:5]))
    ).detach()
    logits, gradients = logits_and_gradients(predictor, z, projected)
    np.testing.assert_allclose(
        logits.detach(), predictor.pairwise_projected(z, projected).detach(), atol=1e-5
    )
    for m in range(3):
        for q in range(5):
            point = z[m : m + 1].clone().requires_grad_(True)
            logit = predictor.pairwise_projected(point, projected[q : q + 1])[0, 0]
            (expected,) = torch.autograd.grad(logit, point)
            np.testing.assert_allclose(
                gradients[m, q].detach(), expected[0], rtol=1e-4, atol=1e-5
            )


def test_the_factors_invert_the_laplace_precision(embedder, data):
    predictor = embedder.net_.module_.predictor
    projected = predictor.project_query(
        torch.as_tensor(data.encoder.transform(data.query_ids[:40]))
    ).detach()
    z = torch.randn(1, 16, generator=torch.Generator().manual_seed(1))
    codes = [torch.arange(40)]
    factors = posterior_factors(predictor, z, projected, codes, penalty=0.5)[0]
    precision = 0.5 * torch.eye(16, dtype=torch.float64)
    for q in range(40):
        point = z.clone().requires_grad_(True)
        logit = predictor.pairwise_projected(point, projected[q : q + 1])[0, 0]
        (gradient,) = torch.autograd.grad(logit, point)
        p = torch.sigmoid(logit).item()
        gradient = gradient[0].double()
        precision += p * (1 - p) * torch.outer(gradient, gradient)
    np.testing.assert_allclose(
        factors.T @ factors, torch.linalg.inv(precision), rtol=1e-3, atol=1e-6
    )


def test_more_evaluations_make_a_model_more_certain(embedder, data):
    few = _router(embedder, data, data.query_ids[:16])
    many = _router(embedder, data, data.query_ids[:250])
    test = data.query_ids[250:]
    spreads = []
    for router in (few, many):
        inner = router.embedder_.estimator
        predictor = inner.net_.module_.predictor
        projected = predictor.project_query(
            torch.as_tensor(inner._encode(test))
        ).detach()
        z = torch.as_tensor(router.embeddings_ * np.float32(inner.embedding_scale_))
        spreads.append(logit_stds(predictor, z, _factors(router), projected))
    assert spreads[0].shape == (50, 6)
    assert (spreads[1].mean(0) < spreads[0].mean(0)).all()


def test_thompson_routes_are_drawn_alike_for_a_seed(embedder, data):
    queries, test = data.query_ids[:40], data.query_ids[200:]
    greedy = _router(embedder, data, queries)
    routes = []
    for seed in (0, 0, 1):
        router = _router(
            embedder, data, queries, exploration="thompson", random_state=seed
        )
        routes.append([router.predict(test), router.predict(test)])
        np.testing.assert_array_equal(
            router.predict_correctness(test), greedy.predict_correctness(test)
        )
        np.testing.assert_array_equal(
            router.predict(test, explore=False), greedy.predict(test)
        )
        # Ranked by draws, but the probabilities given are the best guesses.
        models, probabilities = router.rank_models(test, k=1)
        columns = [router.classes_.tolist().index(m) for m in models[:, 0]]
        best_guesses = router.predict_correctness(test)
        np.testing.assert_array_equal(
            probabilities[:, 0], best_guesses[np.arange(len(test)), columns]
        )
    np.testing.assert_array_equal(routes[0][0], routes[1][0])
    np.testing.assert_array_equal(routes[0][1], routes[1][1])
    assert (routes[0][0] != routes[0][1]).any()  # each call draws afresh
    assert (routes[0][0] != routes[2][0]).any()
    assert (routes[0][0] != greedy.predict(test)).any()
    assert greedy.score(test, _table(data, test)) == router.score(
        test, _table(data, test)
    )


def test_ucb_leans_towards_the_uncertain_model(embedder, data):
    queries, test = data.query_ids[:200], data.query_ids[200:]
    table = _table(data, queries)
    # Model 0 keeps 8 evaluations, the others all theirs: the bound lifts model 0.
    table.iloc[8:, 0] = np.nan

    def fitted(**params):
        return LocusRouter(
            FrozenEstimator(embedder), refine_steps=10, query_heads=False, **params
        ).fit(queries, table)

    greedy, ucb = fitted(), fitted(exploration="ucb", exploration_strength=2.0)
    _, best_guesses, bounds = next(ucb._chunks(test, explore=True))
    lift = np.log(bounds / (1 - bounds)) - np.log(best_guesses / (1 - best_guesses))
    assert (lift > 0).all()
    assert (lift[:, 0] > lift[:, 1:].max(axis=1)).all()
    np.testing.assert_array_equal(ucb.predict(test), ucb.predict(test))  # no draws
    faint = fitted(exploration="ucb", exploration_strength=1e-9)
    # Routes exactly: a faint bound moves probabilities by rounding at most,
    # which changes a route only at the very edge of a near-tie (1e-6).
    np.testing.assert_array_equal(faint.predict(test), greedy.predict(test))


def test_learning_keeps_the_uncertainty_current(embedder, data):
    queries = data.query_ids[:60]
    router = _router(embedder, data, queries, exploration="ucb")
    _factors(router)
    more = data.query_ids[60:120]
    router.partial_fit(more, _table(data, more)[data.model_names[:2]])
    stages = router.stages_
    cached = stages.exploration.cache.factors.clone()
    fresh = stages.exploration.posterior_factors(
        stages.locus, stages.locus.embeddings, router._pool_sets()
    )
    np.testing.assert_allclose(cached, fresh, atol=1e-5)
    router.remove_models(data.model_names[:1])
    kept = router.stages_.exploration.cache.factors
    assert kept.shape[0] == 5
    np.testing.assert_allclose(kept, cached[1:])


def test_exploration_needs_a_locus_embedder(data):
    X = data.encoder.transform(data.query_ids[:20])
    router = LocusRouter(FrozenEstimator(PCA(2).fit(X)), exploration="thompson")
    with pytest.raises(
        ValueError, match="exploration='thompson' needs a LocusEmbedder"
    ):
        router.fit(data.query_ids[:20], _table(data, data.query_ids[:20]))


@pytest.mark.parametrize(
    "change, message",
    [
        ({"exploration": "bogus"}, "'exploration' parameter"),
        ({"exploration_strength": np.inf}, "'exploration_strength' parameter"),
        ({"exploration_strength": np.nan}, "'exploration_strength' parameter"),
        ({"exploration_strength": True}, "'exploration_strength' parameter"),
    ],
)
def test_settings_changed_after_fit_are_checked_when_routing(
    embedder, data, change, message
):
    # Hostile input round 2, N9: set_params after fit was never validated.
    queries = data.query_ids[:120]
    router = _router(embedder, data, queries, exploration="ucb")
    router.set_params(**change)
    with pytest.raises(ValueError, match=message):
        router.predict(queries[:5])
