"""Query groups: per-model, per-group offsets of LOCUS's predictions."""

import joblib
import numpy as np
import pandas as pd
import pytest
from sklearn.base import clone
from sklearn.frozen import FrozenEstimator
from tiny import TINY_NETWORK

import sklocus
from sklocus import LocusEmbedder, LocusRouter
from sklocus._groups import (
    apply_group_offsets,
    check_query_groups,
    fit_group_offsets,
    logits,
)
from sklocus.datasets import make_evaluations
from sklocus.evaluations import to_matrix
from sklocus.metrics import correctness_log_likelihood

# Trained a little longer than TINY_NETWORK, so that LOCUS predicts something.
SMALL = dict(TINY_NETWORK, max_epochs=3, epoch_size=256, validation_fraction=None)


def test_offsets_are_the_shrunken_estimate_of_each_groups_level():
    # Base logits of 0 (p = 0.5): a group with k of n correct has MAP offset
    # solving sum(sigmoid(d) - y) + shrinkage * d = 0.
    scores = np.array([[1.0] * 30 + [0.0] * 10 + [1.0, 0.0]]).T  # 42 queries, 1 model
    groups = np.array(["a"] * 40 + ["b"] * 2, dtype=object)
    base = np.zeros(scores.shape)
    labels, weak = fit_group_offsets(base, scores, groups, shrinkage=1e-6)
    assert list(labels) == ["a", "b"]
    np.testing.assert_allclose(weak[0], [np.log(3.0), 0.0], atol=1e-4)
    _, strong = fit_group_offsets(base, scores, groups, shrinkage=10.0)
    d = strong[0, 0]
    assert 0 < d < np.log(3.0)
    assert abs(40 / (1 + np.exp(-d)) - 30 + 10.0 * d) < 1e-4
    # Few evaluations move an offset less than many at the same rate.
    few = np.array([[1.0] * 3 + [0.0]]).T
    one_group = np.array(["a"] * 4, dtype=object)
    _, small = fit_group_offsets(np.zeros(few.shape), few, one_group, 10.0)
    assert 0 < small[0, 0] < d


def test_unobserved_scores_and_unlabelled_queries_are_left_out():
    scores = np.array([[1.0, np.nan], [1.0, 0.0], [np.nan, 0.0], [0.0, 1.0]])
    groups = np.array(["g", "g", "g", None], dtype=object)
    _, offsets = fit_group_offsets(np.zeros(scores.shape), scores, groups, 1e-6)
    assert offsets[0, 0] > 5  # model 0: 1, 1 in g
    assert offsets[1, 0] < -5  # model 1: 0, 0 in g (its 1 has no group)


def test_apply_adds_offsets_on_the_logit_scale_and_skips_unknown_groups():
    p = np.array([[0.5, 0.2], [0.5, 0.2], [0.5, 0.2]], dtype=np.float32)
    groups = np.array(["a", "b"], dtype=object)
    offsets = np.array([[1.0, -1.0], [0.0, 2.0]], dtype=np.float32)
    out = apply_group_offsets(
        p, np.array(["a", "zzz", None], dtype=object), groups, offsets
    )
    np.testing.assert_allclose(out[0], 1 / (1 + np.exp(-(logits(p[0]) + [1.0, 0.0]))))
    np.testing.assert_array_equal(out[1:], p[1:])


def test_bad_groups_are_named():
    with pytest.raises(ValueError, match="3 labels for 4 queries"):
        check_query_groups(["a", "b", "c"], 4)
    with pytest.raises(TypeError, match=r"query_groups\[1\] is \['b'\]"):
        check_query_groups(["a", ["b"]], 2)
    with pytest.raises(TypeError, match="single str"):
        check_query_groups("abc", 3)
    groups = check_query_groups(["a", None, float("nan"), 3], 4)
    assert list(groups) == ["a", None, None, 3]


@pytest.fixture(scope="module")
def pool():
    """A pool in which one model is far better on benchmark 0 than LOCUS can see."""
    data = make_evaluations(
        n_models=24, n_queries=400, evals_per_model=None, query_dim=16, random_state=3
    )
    embedder = LocusEmbedder(query_encoder=data.encoder, **SMALL)
    embedder.fit(data.evaluation_sets)
    scores, queries = to_matrix(data.evaluation_sets)
    benchmark = dict(zip(data.query_ids, data.benchmarks))
    groups = np.array([f"b{benchmark[q]}" for q in queries], dtype=object)
    scores[groups == "b0", 0] = 1.0  # model 0 answers all of benchmark 0
    train, test = np.arange(300), np.arange(300, 400)
    Y = pd.DataFrame(scores, columns=data.model_names)
    return embedder, np.asarray(queries, dtype=object), groups, Y, train, test


def _router(pool, **params):
    embedder, queries, groups, Y, train, _ = pool
    router = LocusRouter(FrozenEstimator(embedder), **params)
    return router.fit(list(queries[train]), Y.iloc[train], query_groups=groups[train])


@pytest.mark.slow
def test_groups_correct_what_the_embedding_misses(pool):
    _, queries, groups, Y, _, test = pool
    router = _router(pool)
    assert set(router.groups_) == {"b0", "b1", "b2", "b3", "b4"}
    assert router.group_offsets_.shape == (24, 5)
    column = list(router.groups_).index("b0")
    assert router.group_offsets_[0, column] > 0.5
    plain = router.predict_correctness(list(queries[test]))
    grouped = router.predict_correctness(list(queries[test]), query_groups=groups[test])
    in_b0 = groups[test] == "b0"
    assert (grouped[in_b0, 0] > plain[in_b0, 0]).all()
    truth = Y.iloc[test].to_numpy()
    assert correctness_log_likelihood(truth, grouped) > correctness_log_likelihood(
        truth, plain
    )
    # predict, rank_models, predict_proba and score take the groups alike.
    chosen = router.predict(list(queries[test]), query_groups=groups[test])
    ranked, _ = router.rank_models(list(queries[test]), k=1, query_groups=groups[test])
    np.testing.assert_array_equal(chosen, ranked[:, 0])
    np.testing.assert_array_equal(
        chosen,
        router.classes_[
            np.argmax(router.predict_proba(list(queries[test]), groups[test]), axis=1)
        ],
    )
    assert (
        0
        <= router.score(list(queries[test]), Y.iloc[test], query_groups=groups[test])
        <= 1
    )


@pytest.mark.slow
def test_stronger_shrinkage_keeps_offsets_nearer_zero(pool):
    weak = _router(pool, group_shrinkage=1.0).group_offsets_
    strong = _router(pool, group_shrinkage=100.0).group_offsets_
    assert np.abs(strong).sum() < np.abs(weak).sum()


@pytest.mark.slow
def test_onboarded_models_get_offsets_from_a_query_to_group_map(pool):
    embedder, queries, groups, Y, train, _ = pool
    router = _router(pool)
    evaluations = dict(zip(queries[train], Y.iloc[train, 0]))
    router.add_models([evaluations], ["again"], query_groups=dict(zip(queries, groups)))
    np.testing.assert_allclose(
        router.group_offsets_[-1], router.group_offsets_[0], atol=1e-5
    )
    router.add_models([evaluations], ["no groups"])
    np.testing.assert_array_equal(router.group_offsets_[-1], 0)
    router.remove_models(["again"])
    assert router.group_offsets_.shape == (25, 5)
    with pytest.raises(TypeError, match="mapping from each query"):
        router.add_models([evaluations], ["x"], query_groups=list(groups))
    plain = LocusRouter(FrozenEstimator(embedder), query_clusters=None)
    plain.fit(list(queries[train]), Y.iloc[train])
    assert plain.groups_ is None and plain.group_offsets_ is None
    with pytest.raises(ValueError, match="fitted without query_groups"):
        plain.add_models([evaluations], ["x"], query_groups={})
    clustered = LocusRouter(FrozenEstimator(embedder), query_clusters=3)
    clustered.fit(list(queries[train]), Y.iloc[train])
    with pytest.raises(ValueError, match="clusters of its queries"):
        clustered.add_models([evaluations], ["x"], query_groups={})


@pytest.mark.slow
def test_group_offsets_survive_saving(pool, tmp_path):
    _, queries, groups, *_, test = pool
    router = _router(pool)
    sklocus.save(router, tmp_path / "router.model")
    loaded = sklocus.load(tmp_path / "router.model")
    np.testing.assert_array_equal(loaded.group_offsets_, router.group_offsets_)
    np.testing.assert_array_equal(
        loaded.predict_correctness(list(queries[test]), query_groups=groups[test]),
        router.predict_correctness(list(queries[test]), query_groups=groups[test]),
    )
    joblib.dump(router, tmp_path / "router.joblib")
    again = joblib.load(tmp_path / "router.joblib")
    np.testing.assert_array_equal(again.group_offsets_, router.group_offsets_)


@pytest.mark.slow
def test_routers_refine_the_pool_by_default_and_leave_the_embedder_alone(pool):
    embedder, queries, _, Y, train, _ = pool
    assert LocusRouter().refine_steps == 50
    router = LocusRouter(FrozenEstimator(embedder)).fit(
        list(queries[train]), Y.iloc[train]
    )
    assert embedder.refine_steps == 0
    sets = [dict(zip(queries[train], Y.iloc[train, j])) for j in range(Y.shape[1])]
    refined = clone(embedder).set_params(refine_steps=50)
    refined.__dict__.update(
        {k: v for k, v in vars(embedder).items() if k.endswith("_")}
    )
    np.testing.assert_allclose(router.embeddings_, refined.transform(sets), atol=1e-5)
    forward = LocusRouter(FrozenEstimator(embedder), refine_steps=None)
    forward.fit(list(queries[train]), Y.iloc[train])
    np.testing.assert_allclose(forward.embeddings_, embedder.transform(sets), atol=1e-6)
    assert np.abs(router.embeddings_ - forward.embeddings_).max() > 1e-3
