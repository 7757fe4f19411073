import itertools

import numpy as np
import pytest
from sklearn.utils.estimator_checks import parametrize_with_checks

from sklocus import CoverageGreedySelector, KCenterSelector, KMedoidsSelector


@parametrize_with_checks(
    [
        KCenterSelector(n_selected=3),
        KMedoidsSelector(n_selected=2),
        CoverageGreedySelector(max_total_cost=3),
    ]
)
def test_scikit_learn_checks(estimator, check):
    check(estimator)


def _random_embeddings(seed, n_models=9, dim=3):
    return np.random.default_rng(seed).normal(size=(n_models, dim))


@pytest.mark.parametrize("metric", ["cosine", "euclidean"])
@pytest.mark.parametrize("seed", range(6))
def test_k_center_is_within_twice_the_optimum(seed, metric):
    from sklocus.geometry import model_distances

    Z = _random_embeddings(seed)
    distances = model_distances(Z, metric=metric)
    k = 3
    optimum = min(
        distances[:, list(subset)].min(axis=1).max()
        for subset in itertools.combinations(range(len(Z)), k)
    )
    selector = KCenterSelector(n_selected=k, metric=metric).fit(Z)
    assert selector.radius_ <= 2 * optimum + 1e-12
    assert selector.radius_ == pytest.approx(
        distances[:, selector.selected_indices_].min(axis=1).max()
    )
    assert len(set(selector.selected_indices_.tolist())) == k
    # Deterministic.
    np.testing.assert_array_equal(
        KCenterSelector(n_selected=k, metric=metric).fit(Z).selected_indices_,
        selector.selected_indices_,
    )


def _brute_force_coverage(similarity, cost, max_total_cost):
    best = 0.0
    for size in range(1, len(cost) + 1):
        for subset in itertools.combinations(range(len(cost)), size):
            if cost[list(subset)].sum() <= max_total_cost:
                best = max(best, similarity[:, list(subset)].max(axis=1).mean())
    return best


@pytest.mark.parametrize("seed", range(8))
def test_coverage_greedy_respects_max_total_cost_and_the_greedy_bound(seed):
    from sklocus._selection import (
        GREEDY_BOUND_UNIT_COST,
        GREEDY_BOUND_WITH_COSTS,
        coverage_similarity,
    )
    from sklocus.geometry import model_distances

    rng = np.random.default_rng(seed)
    Z = _random_embeddings(seed, n_models=8)
    distances = model_distances(Z)
    similarity = coverage_similarity(distances, distances.max())

    unit = CoverageGreedySelector(max_total_cost=3).fit(Z)
    assert unit.total_cost_ <= 3 and len(unit.selected_indices_) == 3
    optimum = _brute_force_coverage(similarity, np.ones(8), 3)
    assert unit.coverage_ >= GREEDY_BOUND_UNIT_COST * optimum - 1e-12
    assert unit.coverage_ <= optimum + 1e-12

    cost = rng.uniform(0.5, 5.0, size=8)
    max_total_cost = 6.0
    costly = CoverageGreedySelector(max_total_cost=max_total_cost).fit(Z, cost=cost)
    assert costly.total_cost_ <= max_total_cost
    assert costly.total_cost_ == pytest.approx(cost[costly.selected_indices_].sum())
    optimum = _brute_force_coverage(similarity, cost, max_total_cost)
    assert costly.coverage_ >= GREEDY_BOUND_WITH_COSTS * optimum - 1e-12
    assert costly.coverage_ == pytest.approx(
        similarity[:, costly.selected_indices_].max(axis=1).mean()
    )


@pytest.mark.parametrize("metric", ["cosine", "euclidean"])
def test_k_medoids_agrees_with_the_kmedoids_package(metric):
    import kmedoids

    from sklocus.geometry import model_distances

    Z = _random_embeddings(0, n_models=40, dim=5)
    # FasterPAM's swaps visit the models in a random order, so the two runs
    # need one seed: the selector derives its seed from random_state.
    selector = KMedoidsSelector(n_selected=4, metric=metric, random_state=0).fit(Z)
    seed = np.random.RandomState(0).randint(np.iinfo(np.int32).max)
    reference = kmedoids.fasterpam(
        model_distances(Z, metric=metric),
        4,
        init="build",
        n_cpu=1,
        random_state=seed,
    )
    np.testing.assert_array_equal(selector.selected_indices_, reference.medoids)
    np.testing.assert_array_equal(selector.labels_, reference.labels)
    assert selector.inertia_ == pytest.approx(reference.loss)


@pytest.mark.parametrize(
    "selector", [KCenterSelector(3), KMedoidsSelector(3), CoverageGreedySelector(3)]
)
def test_predict_transform_and_labels_agree(selector):
    Z = _random_embeddings(1, n_models=20)
    selector.fit(Z)
    distances = selector.transform(Z)
    assert distances.shape == (20, 3)
    np.testing.assert_array_equal(selector.predict(Z), selector.labels_)
    np.testing.assert_array_equal(distances.argmin(axis=1), selector.labels_)
    np.testing.assert_allclose(selector.cluster_centers_, Z[selector.selected_indices_])
    # Each selected model maps to itself.
    np.testing.assert_array_equal(
        selector.labels_[selector.selected_indices_], np.arange(3)
    )


@pytest.mark.parametrize("selector", [KCenterSelector(5), KMedoidsSelector(5)])
def test_fewer_models_than_asked_selects_them_all(selector):
    Z = _random_embeddings(2, n_models=3)
    selector.fit(Z)
    assert sorted(selector.selected_indices_.tolist()) == [0, 1, 2]
    np.testing.assert_array_equal(
        selector.labels_, np.argsort(selector.selected_indices_)
    )


def test_identical_embeddings():
    Z = np.ones((6, 4))
    k_center = KCenterSelector(3).fit(Z)
    assert k_center.selected_indices_.tolist() == [0] and k_center.radius_ == 0.0
    coverage = CoverageGreedySelector(3).fit(Z)
    assert coverage.selected_indices_.tolist() == [0] and coverage.coverage_ == 1.0
    medoids = KMedoidsSelector(2).fit(Z)
    assert medoids.inertia_ == 0.0


@pytest.mark.parametrize(
    ("fit", "message"),
    [
        (
            lambda Z: CoverageGreedySelector(1).fit(Z, cost=np.full(len(Z), 2.0)),
            "max_total_cost=1 is below every model's cost (the cheapest costs 2.0)",
        ),
        (
            lambda Z: CoverageGreedySelector(3).fit(
                Z, cost=np.r_[1.0, 0.0, np.ones(len(Z) - 2)]
            ),
            "model 1 has cost 0.0; costs must be finite and positive",
        ),
        (
            lambda Z: CoverageGreedySelector(3).fit(Z, cost=-np.ones(len(Z))),
            "model 0 has cost -1.0",
        ),
        (
            lambda Z: CoverageGreedySelector(3).fit(Z, cost=[1.0]),
            "give one cost per model (5)",
        ),
        (
            lambda Z: KCenterSelector(2).fit(np.r_[Z[:4], [[np.nan] * 3]]),
            "Input X contains NaN",
        ),
        (
            lambda Z: KMedoidsSelector(2, metric="manhattan").fit(Z),
            "'metric' parameter of KMedoidsSelector must be",
        ),
    ],
)
def test_degenerate_input_is_named(fit, message):
    with pytest.raises(ValueError) as raised:
        fit(_random_embeddings(3, n_models=5))
    assert message in str(raised.value)


def test_pipelines_after_the_embedder_and_metadata_routing():
    import sklearn
    from sklearn.pipeline import make_pipeline

    from sklocus import LocusEmbedder
    from sklocus.datasets import make_evaluations

    data = make_evaluations(
        n_models=20, n_queries=200, evals_per_model=50, query_dim=8, random_state=0
    )
    tiny = dict(
        embedding_dim=8,
        n_latents=2,
        n_layers=1,
        n_heads=2,
        max_epochs=1,
        epoch_size=1,
        random_state=0,
    )
    pipeline = make_pipeline(
        LocusEmbedder(query_encoder=data.encoder, **tiny), KCenterSelector(5)
    )
    pipeline.fit(data.evaluation_sets)
    assert len(pipeline[-1].selected_indices_) == 5
    assert pipeline.transform(data.evaluation_sets).shape == (20, 5)

    with sklearn.config_context(enable_metadata_routing=True):
        pipeline = make_pipeline(
            LocusEmbedder(query_encoder=data.encoder, **tiny),
            CoverageGreedySelector(max_total_cost=30).set_fit_request(cost=True),
        )
        pipeline.fit(data.evaluation_sets, cost=data.params_b)
        selector = pipeline[-1]
        assert selector.total_cost_ <= 30
        assert selector.total_cost_ == pytest.approx(
            data.params_b[selector.selected_indices_].sum()
        )


def test_k_center_never_picks_a_model_twice_even_all_zero_rows_under_cosine():
    rng = np.random.default_rng(0)
    z = np.vstack([np.zeros((3, 4)), rng.normal(size=(5, 4))])
    chosen = KCenterSelector(n_selected=6).fit(z).selected_indices_.tolist()
    assert len(chosen) == len(set(chosen)) == 6


def test_numpy_integer_parameters_work():
    z = np.random.default_rng(0).normal(size=(12, 3))
    for selector in (KMedoidsSelector, KCenterSelector):
        chosen = selector(n_selected=np.int64(3)).fit(z).selected_indices_
        assert len(chosen) == 3


def test_a_max_total_cost_below_one_model_without_costs_is_refused():
    z = np.random.default_rng(0).normal(size=(5, 3))
    with pytest.raises(
        ValueError, match=r"max_total_cost=0.5 is below 1.*every model costs 1"
    ):
        CoverageGreedySelector(max_total_cost=0.5).fit(z)


def _full_scan_greedy(similarity, cost, max_total_cost):
    """Greedy coverage that recomputes every gain at every step: the reference."""
    best, selected, spent = np.zeros(len(cost)), [], 0.0
    while True:
        affordable = cost <= max_total_cost - spent + 1e-12
        affordable[selected] = False
        if not affordable.any():
            return selected
        gains = np.maximum(similarity - best[:, None], 0.0).sum(axis=0)
        pick = int(np.argmax(np.where(affordable, gains / cost, -np.inf)))
        if gains[pick] <= 0 and selected:
            return selected
        selected.append(pick)
        spent += cost[pick]
        best = np.maximum(best, similarity[:, pick])


@pytest.mark.parametrize("seed", range(30))
def test_lazy_greedy_chooses_what_a_full_scan_chooses(seed):
    from sklocus._selection import _lazy_greedy, coverage_similarity
    from sklocus.geometry import model_distances

    rng = np.random.default_rng(seed)
    n_models = int(rng.integers(5, 60))
    Z = rng.normal(size=(n_models, 3))
    if seed % 3 == 0:
        Z[: n_models // 3] = Z[0]  # identical models: ties between gains
    cost = rng.uniform(0.5, 5.0, n_models) if seed % 2 else np.ones(n_models)
    max_total_cost = max(float(rng.uniform(1, 15)), cost.min())
    distances = model_distances(Z)
    similarity = coverage_similarity(distances, distances.max())
    assert _lazy_greedy(similarity, cost, max_total_cost) == _full_scan_greedy(
        similarity, cost, max_total_cost
    )
