"""Query heads: each pool model's own logistic regression, blended with LOCUS."""

import numpy as np
import pandas as pd
import pytest
from sklearn.frozen import FrozenEstimator
from tiny import TINY_NETWORK

import sklocus
from sklocus import LocusEmbedder, LocusRouter
from sklocus._router._heads import (
    MIN_EVALUATIONS,
    apply_heads,
    fit_heads,
    heads_wanted,
    unseen_logits,
)
from sklocus.datasets import make_evaluations
from sklocus.evaluations import to_matrix

SMALL = dict(TINY_NETWORK, max_epochs=2, epoch_size=256, validation_fraction=None)


def _linear_pool(n_queries=600, n_models=3, seed=0):
    """Scores drawn from one logistic regression per model on random encodings."""
    rng = np.random.default_rng(seed)
    vectors = rng.normal(size=(n_queries, 8))
    truth = rng.normal(size=(n_models, 8)) * 1.5
    p = 1.0 / (1.0 + np.exp(-(vectors @ truth.T)))
    scores = (rng.random(p.shape) < p).astype(float)
    return vectors, scores, truth


def _rows_of(scores):
    observed = ~np.isnan(scores)
    return lambda j: np.flatnonzero(observed[:, j])


def test_heads_learn_what_locus_misses_and_the_blend_trusts_them():
    vectors, scores, truth = _linear_pool()
    locus = np.zeros(scores.shape)  # LOCUS knows nothing here
    weights, biases, blends, held_out, blend = fit_heads(
        vectors, scores, locus, _rows_of(scores)
    )
    assert weights.shape == (3, 8) and weights.dtype == np.float32
    for fitted, true in zip(weights, truth):
        assert np.corrcoef(fitted, true)[0, 1] > 0.9
    assert blend > 0.8
    np.testing.assert_array_equal(blends, np.float32(blend))
    assert np.isfinite(held_out).all()  # every evaluation predicted out of fold


def test_the_blend_stays_with_locus_where_it_already_knows():
    vectors, scores, truth = _linear_pool(seed=1)
    locus = vectors @ truth.T  # LOCUS has the true logits
    noise = np.random.default_rng(2).normal(size=vectors.shape)
    _, _, blends, _, _ = fit_heads(noise, scores, locus, _rows_of(scores))
    assert (blends < 0.2).all()


def test_models_with_few_evaluations_or_one_sided_scores_get_no_head():
    vectors, scores, _ = _linear_pool()
    scores[MIN_EVALUATIONS - 1 :, 0] = np.nan  # too few evaluations
    scores[:, 1] = 1.0  # all correct: nothing to learn
    weights, biases, blends, held_out, _ = fit_heads(
        vectors, scores, np.zeros(scores.shape), _rows_of(scores)
    )
    assert blends[0] == blends[1] == 0 and blends[2] > 0
    assert not weights[:2].any() and not biases[:2].any()
    assert np.isnan(held_out[:, :2]).all()
    # A model without a head is predicted by LOCUS alone.
    locus = np.full((5, 3), 0.7, dtype=np.float32)
    blended = apply_heads(locus, vectors[:5], weights, biases, blends)
    np.testing.assert_allclose(blended[:, :2], 0.7, rtol=1e-6)


def test_the_blend_is_chosen_on_queries_locus_never_trained_on():
    vectors, scores, _ = _linear_pool()
    memorised = np.where(scores > 0.5, 6.0, -6.0)  # LOCUS in-sample: perfect
    *_, in_sample = fit_heads(vectors, scores, memorised, _rows_of(scores))
    assert in_sample < 0.1
    # On queries it never trained on, that LOCUS knows nothing.
    unseen = np.arange(len(scores)) % 5 == 0
    *_, chosen = fit_heads(
        vectors,
        scores,
        memorised,
        _rows_of(scores),
        blend_on=(unseen, np.zeros(scores.shape)),
    )
    assert chosen > 0.8


@pytest.mark.slow
def test_a_router_knows_the_queries_its_embedder_held_out(tmp_path):
    data = make_evaluations(
        n_models=6, n_queries=200, evals_per_model=None, random_state=0
    )
    settings = dict(SMALL, validation_fraction="auto")  # small: holds out queries
    embedder = LocusEmbedder(query_encoder=data.encoder, **settings)
    held = embedder.fit(data.evaluation_sets).validation_queries_
    assert len(held) == len(set(held)) == 20  # a tenth of the 200 queries
    router = LocusRouter(FrozenEstimator(embedder))
    router.fit_evaluations(data.evaluation_sets, data.model_names)
    assert 0 <= router.head_blend_ <= 1
    scores, queries = to_matrix(data.evaluation_sets)
    vectors = embedder._encode(queries)
    unseen, found = unseen_logits(router.stages_, queries, scores, vectors, None)
    assert {queries[i] for i in np.flatnonzero(unseen)} == set(held)
    assert np.isfinite(found[unseen]).all() and np.isnan(found[~unseen]).all()
    # A model file keeps them, so a router over the loaded embedder is the same.
    sklocus.save(embedder, tmp_path / "embedder.sklocus")
    loaded = sklocus.load(tmp_path / "embedder.sklocus")
    assert loaded.validation_queries_ == held
    again = LocusRouter(FrozenEstimator(loaded))
    again.fit_evaluations(data.evaluation_sets, data.model_names)
    assert again.head_blend_ == router.head_blend_
    # Fine-tuning may train on any query: none is left unseen.
    embedder.set_params(warm_start=True, max_epochs=1).fit(data.evaluation_sets)
    assert embedder.validation_queries_ is None


def test_a_given_blend_is_kept():
    vectors, scores, _ = _linear_pool()
    _, _, blends, _, blend = fit_heads(
        vectors, scores, np.zeros(scores.shape), _rows_of(scores), blend=0.25
    )
    np.testing.assert_allclose(blends, 0.25)
    assert blend == 0.25


@pytest.fixture(scope="module")
def pool():
    data = make_evaluations(
        n_models=6, n_queries=200, evals_per_model=None, random_state=0
    )
    scores, queries = to_matrix(data.evaluation_sets)
    Y = pd.DataFrame(scores, columns=data.model_names)
    embedder = LocusEmbedder(query_encoder=data.encoder, **SMALL)
    return data, queries, Y, FrozenEstimator(embedder.fit(data.evaluation_sets))


def test_small_pools_get_heads_by_default_and_they_move_predictions(pool):
    data, queries, Y, frozen = pool
    with_heads = LocusRouter(frozen).fit(queries, Y)
    without = LocusRouter(frozen, query_heads=False).fit(queries, Y)
    assert with_heads.head_weights_.shape == (6, data.query_vectors.shape[1])
    assert without.head_weights_ is None and without.head_blends_ is None
    assert not np.allclose(
        with_heads.predict_correctness(queries), without.predict_correctness(queries)
    )
    # "auto" fits heads on pools of fewer than 100 models only.
    assert heads_wanted(LocusRouter(frozen), 99)
    assert not heads_wanted(LocusRouter(frozen), 100)
    assert heads_wanted(LocusRouter(frozen, query_heads=True), 100)


@pytest.mark.slow
def test_heads_survive_saving_adding_and_removing_models(pool, tmp_path):
    data, queries, Y, frozen = pool
    router = LocusRouter(frozen).fit(queries, Y.iloc[:, :4])
    path = tmp_path / "router.skops"
    sklocus.save(router, path)
    loaded = sklocus.load(path)
    np.testing.assert_array_equal(
        loaded.predict_correctness(queries), router.predict_correctness(queries)
    )
    blend = router.head_blend_
    assert blend > 0 and loaded.head_blend_ == blend
    names = list(Y.columns[4:])
    router.add_models(data.evaluation_sets[4:], names)
    assert router.head_weights_.shape[0] == 6
    np.testing.assert_allclose(router.head_blends_[4:], blend)
    # New models' heads are fitted as fit fits them, with the pool's blend.
    refitted = LocusRouter(frozen).fit(queries, Y)
    np.testing.assert_allclose(
        router.head_weights_[4:], refitted.head_weights_[4:], rtol=1e-4, atol=1e-5
    )
    router.remove_models(names[0])
    assert router.head_weights_.shape[0] == router.head_blends_.shape[0] == 5
    assert router.predict_correctness(queries[:3]).shape == (3, 5)


def test_models_added_after_every_headed_model_left_get_the_pools_blend(pool):
    data, queries, Y, frozen = pool
    Y = Y.iloc[:, :3].copy()
    Y.iloc[MIN_EVALUATIONS - 1 :, 0] = np.nan  # too few evaluations for a head
    router = LocusRouter(frozen).fit(queries, Y)
    assert router.head_blends_[0] == 0 and router.head_blend_ > 0
    router.remove_models(list(Y.columns[1:]))
    assert not router.head_blends_.any()  # no model with a head is left
    router.add_models(data.evaluation_sets[3:5], list(data.model_names[3:5]))
    np.testing.assert_array_equal(
        router.head_blends_[1:], np.float32(router.head_blend_)
    )


def test_fit_and_fit_evaluations_fit_the_same_heads(pool):
    data, queries, Y, frozen = pool
    table = LocusRouter(frozen).fit(queries, Y)
    sets = LocusRouter(frozen).fit_evaluations(data.evaluation_sets, data.model_names)
    np.testing.assert_array_equal(table.head_weights_, sets.head_weights_)
    np.testing.assert_array_equal(table.head_blends_, sets.head_blends_)


def test_heads_need_a_locus_embedder():
    class Other:
        def fit(self, X, y=None):
            return self

        def transform(self, X):
            return np.zeros((len(X), 2))

    with pytest.raises(ValueError, match="query_heads=True needs a LocusEmbedder"):
        heads_wanted(LocusRouter(Other(), query_heads=True), 3)
    assert not heads_wanted(LocusRouter(Other()), 3)
