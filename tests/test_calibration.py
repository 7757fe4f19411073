"""Pool calibration: the router fits LOCUS's logits to the pool's held-out scores."""

import numpy as np
import pandas as pd
from marks import slow_fixture
from sklearn.frozen import FrozenEstimator
from tiny import TINY_NETWORK

import sklocus
from sklocus import LocusEmbedder, LocusRouter
from sklocus._groups import logits
from sklocus._router._halves import held_out_pairs, in_both_halves, split_halves
from sklocus._router._pool_calibration import (
    apply_calibration,
    fit_calibration,
    fit_new_offsets,
)
from sklocus.datasets import make_evaluations
from sklocus.evaluations import to_matrix

SMALL = dict(TINY_NETWORK, max_epochs=3, epoch_size=256, validation_fraction=None)


def _draw(slope, offsets, pairs_per_model, seed=0):
    """Held-out logits around level 0, and scores drawn from the calibrated ones."""
    rng = np.random.default_rng(seed)
    models = np.repeat(np.arange(len(offsets)), pairs_per_model)
    x = rng.normal(0.0, 2.0, len(models))
    p = 1.0 / (1.0 + np.exp(-(offsets[models] + slope * x)))
    return x, (rng.random(len(models)) < p).astype(float), models


def test_calibration_recovers_the_slope_and_each_models_offset():
    offsets = np.array([-1.0, 0.0, 0.5, 1.5])
    for slope in (0.3, 1.0, 1.6):
        x, y, models = _draw(slope, offsets, 10_000)
        fitted_slope, intercept, fitted = fit_calibration(
            x, y, models, 0 * models, np.zeros(4)
        )
        assert abs(fitted_slope - slope) < 0.08
        np.testing.assert_allclose(fitted, offsets, atol=0.15)
        assert fitted.dtype == np.float32
        assert abs(intercept - fitted.mean()) < 0.3  # the offsets' centre


def test_few_pairs_keep_predictions_nearly_as_they_are():
    x, y, models = _draw(0.2, np.array([2.0, -2.0]), 3)
    slope, intercept, offsets = fit_calibration(x, y, models, 0 * models, np.zeros(2))
    assert 0.5 < slope < 1.5 and abs(intercept) < 0.5
    assert np.abs(offsets).max() < 1.0
    slope, intercept, offsets = fit_calibration(
        np.zeros(0), np.zeros(0), np.zeros(0, int), np.zeros(0, int), np.ones(3)
    )
    assert (slope, intercept) == (1.0, 0.0)
    np.testing.assert_array_equal(offsets, np.zeros(3))


def test_new_offsets_are_shrunk_towards_the_pools():
    x, y, models = _draw(1.0, np.array([1.0]), 2000)
    far = fit_new_offsets(
        x, y, models, 0 * models, np.zeros(1), slope=1.0, intercept=-1.0
    )
    assert abs(far[0] - 1.0) < 0.15
    few = fit_new_offsets(
        x[:4], y[:4], models[:4], 0 * models[:4], np.zeros(2), 1.0, -1.0
    )
    assert abs(few[0] + 1.0) < abs(far[0] + 1.0)
    assert few[1] == np.float32(-1.0)  # no pairs: the pool's offset


def test_a_slope_below_one_pulls_each_model_towards_its_level():
    # Logits spread around each model's level, scores that ignore the spread.
    rng = np.random.default_rng(2)
    levels = np.array([-1.5, 0.0, 1.5])
    models = np.repeat(np.arange(3), 3000)
    x = levels[models] + rng.normal(0.0, 2.0, len(models))
    y = (rng.random(len(models)) < 1 / (1 + np.exp(-levels[models]))).astype(float)
    slope, _, offsets = fit_calibration(x, y, models, 0 * models, levels)
    assert abs(slope) < 0.1
    # A query at any logit is predicted near the model's own level.
    np.testing.assert_allclose(offsets + slope * levels, levels, atol=0.15)


def test_a_half_that_went_better_does_not_pull_the_slope_down():
    # Each half's embedding predicts the other half at a level of its own (a half
    # that went well leaves a worse one to predict); within each half the order of
    # the queries is right, and the slope must say so (1), not shrink with the
    # levels' noise.
    rng = np.random.default_rng(4)
    models = np.repeat(np.arange(200), 40)
    halves = np.tile(np.repeat([0, 1], 20), 200)
    order = rng.normal(0.0, 1.5, len(models))
    y = (rng.random(len(models)) < 1 / (1 + np.exp(-order))).astype(float)
    shift = rng.normal(0.0, 1.0, 400)  # each (model, half)'s own level
    x = order + shift[2 * models + halves]
    slope, _, _ = fit_calibration(x, y, models, halves, np.zeros(200))
    assert abs(slope - 1.0) < 0.15


def test_apply_is_the_affine_map_on_the_logit_scale():
    p = np.array([[0.5, 0.2], [0.9, 0.7]], dtype=np.float32)
    out = apply_calibration(p, 2.0, np.array([0.0, 1.0], dtype=np.float32))
    expected = 1 / (1 + np.exp(-(np.array([0.0, 1.0]) + 2.0 * logits(p))))
    np.testing.assert_allclose(out, expected, rtol=1e-5)
    assert out.dtype == np.float32


def test_halves_split_each_model_alone_and_evenly():
    rng = np.random.default_rng(0)
    observed = rng.random((50, 4)) < 0.6
    observed[:, 3] = False
    observed[7, 3] = True  # one evaluation: nothing to hold out
    rank = np.arange(50)
    half = split_halves(observed, rank)
    np.testing.assert_array_equal(half >= 0, observed)
    for j in range(3):
        counts = np.bincount(half[observed[:, j], j], minlength=2)
        assert abs(counts[0] - counts[1]) <= 1
    assert half[7, 3] == 0
    np.testing.assert_array_equal(in_both_halves(half), [True, True, True, False])
    # A model's halves do not depend on the other models of the pool.
    np.testing.assert_array_equal(
        split_halves(observed[:, [2]], rank)[:, 0], half[:, 2]
    )
    # Nor on the order of the queries: a query keeps its half when moved.
    order = np.random.default_rng(1).permutation(50)
    moved = split_halves(observed[order], rank[order])
    np.testing.assert_array_equal(moved, half[order])


def test_held_out_pairs_predict_each_half_from_the_other():
    observed = np.ones((6, 2), dtype=bool)
    observed[:, 1] = [True, False, False, False, False, False]
    scores = np.where(observed, 1.0, np.nan)
    half = split_halves(observed, np.arange(6))
    probability = {0: 0.25, 1: 0.75}  # from half 0, from half 1

    def predict(h, rows):
        return np.full((len(rows), 2), probability[h])

    held, targets, models, halves = held_out_pairs(predict, scores, half, chunk=4)
    assert len(held) == 6 and (models == 0).all()  # model 1 has one evaluation
    np.testing.assert_array_equal(np.sort(halves), np.sort(1 - half[:, 0]))
    expected = [logits(probability[1 - h]) for h in half[:, 0]]
    np.testing.assert_allclose(np.sort(held), np.sort(expected), rtol=1e-6)
    np.testing.assert_array_equal(targets, 1.0)


@slow_fixture(scope="module")
def trained():
    data = make_evaluations(
        n_models=24, n_queries=300, evals_per_model=None, query_dim=16, random_state=3
    )
    embedder = LocusEmbedder(query_encoder=data.encoder, **SMALL)
    return data, embedder.fit(data.evaluation_sets)


def test_a_calibrated_router_applies_its_slope_and_offsets(trained):
    data, embedder = trained
    scores, queries = to_matrix(data.evaluation_sets)
    Y = pd.DataFrame(scores, columns=data.model_names)
    assert LocusRouter().calibration is None
    # LOCUS and the pool calibration alone: no clusters of the queries.
    alone = dict(query_heads=False, query_clusters=None)
    router = LocusRouter(FrozenEstimator(embedder), calibration="pool", **alone)
    router.fit(queries, Y)
    assert np.isfinite(router.calibration_slope_)
    assert router.model_offsets_.shape == (24,)
    plain = LocusRouter(FrozenEstimator(embedder), calibration=None, **alone)
    plain.fit(queries, Y)
    assert plain.model_offsets_ is None and plain.calibration_slope_ is None
    uncalibrated = embedder.predict_correctness(plain.embeddings_, queries)
    np.testing.assert_array_equal(plain.predict_correctness(queries), uncalibrated)
    np.testing.assert_allclose(
        router.predict_correctness(queries),
        apply_calibration(
            uncalibrated, router.calibration_slope_, router.model_offsets_
        ),
        rtol=1e-5,
    )


def test_where_locus_differences_do_not_hold_models_fall_back_to_their_level(trained):
    # A pool of queries on which every model answers at its own rate, whatever
    # the query: LOCUS's query-by-query differences are noise there.
    data, embedder = trained
    rng = np.random.default_rng(1)
    queries = list(data.query_ids)
    rates = np.linspace(0.15, 0.85, 12)
    scores = (rng.random((len(queries), 12)) < rates).astype(float)
    train, test = np.arange(200), np.arange(200, 300)
    Y = pd.DataFrame(scores[train], columns=[f"m{j}" for j in range(12)])
    chosen = [queries[i] for i in train]
    router = LocusRouter(FrozenEstimator(embedder), calibration="pool").fit(chosen, Y)
    plain = LocusRouter(FrozenEstimator(embedder)).fit(chosen, Y)
    assert router.calibration_slope_ < 0.5
    held = [queries[i] for i in test]
    calibrated = router.predict_correctness(held)
    truth = scores[test]

    def log_loss(p):
        p = np.clip(p, 1e-6, 1 - 1e-6)
        return -np.mean(truth * np.log(p) + (1 - truth) * np.log(1 - p))

    assert log_loss(calibrated) < log_loss(plain.predict_correctness(held))
    np.testing.assert_allclose(calibrated.mean(axis=0), rates, atol=0.12)


def test_onboarded_and_removed_models_keep_their_offsets(trained, tmp_path):
    data, embedder = trained
    scores, queries = to_matrix(data.evaluation_sets)
    Y = pd.DataFrame(scores, columns=data.model_names)
    # LOCUS and the pool calibration alone: no clusters of the queries.
    alone = dict(query_heads=False, query_clusters=None)
    router = LocusRouter(FrozenEstimator(embedder), calibration="pool", **alone)
    router.fit(queries, Y)
    router.add_models([data.evaluation_sets[2]], ["copy of 2"])
    # The same evaluations give nearly the same offset: the joint fit and the
    # new model's Newton steps solve the same problem with the slope fixed.
    assert abs(router.model_offsets_[-1] - router.model_offsets_[2]) < 0.05
    router.remove_models([data.model_names[0]])
    assert router.model_offsets_.shape == (24,)
    path = tmp_path / "router.sklocus"
    sklocus.save(router, path)
    loaded = sklocus.load(path)
    np.testing.assert_array_equal(loaded.model_offsets_, router.model_offsets_)
    assert loaded.calibration_slope_ == router.calibration_slope_
    np.testing.assert_array_equal(
        loaded.predict_correctness(queries), router.predict_correctness(queries)
    )
