"""Groups learnt from the query encodings: from labels (soft), or clusters.

A pool whose models are strong on some clusters of queries and weak on others
(P(correct) 0.85 or 0.15), and a barely trained LOCUS network.
"""

import pickle

import numpy as np
import pandas as pd
import pytest
from model_file_edits import as_format_8, holder, rewrite
from sklearn.frozen import FrozenEstimator
from tiny import TINY_NETWORK

import sklocus
from sklocus import LocusEmbedder, LocusRouter
from sklocus._router._learnt_groups import (
    CLUSTER_GRID,
    QUERIES_PER_CLUSTER,
    held_out_loss,
    shifted,
)
from sklocus.cli._models import groups_line
from sklocus.encoders import PrecomputedEncoder

N_CLUSTERS = 4


@pytest.fixture(scope="module")
def pool():
    """12 models, 320 queries in 4 clusters of 8-d encodings, 30% unobserved."""
    rng = np.random.default_rng(0)
    n_queries, n_models = 320, 12
    cluster = np.arange(n_queries) % N_CLUSTERS
    centres = rng.normal(size=(N_CLUSTERS, 8)) * 2.0
    vectors = centres[cluster] + 0.3 * rng.normal(size=(n_queries, 8))
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    queries = [f"q{i:03d}" for i in range(n_queries)]
    accuracy = rng.choice([0.15, 0.85], size=(n_models, N_CLUSTERS))
    scores = (rng.random((n_queries, n_models)) < accuracy[:, cluster].T) * 1.0
    scores[rng.random(scores.shape) < 0.3] = np.nan
    names = [f"m{j}" for j in range(n_models)]
    Y = pd.DataFrame(scores, columns=names)
    encoder = PrecomputedEncoder(queries, vectors.astype(np.float32))
    sets = [{q: s for q, s in zip(queries, Y[name]) if s == s} for name in names[:6]]
    # Barely trained: LOCUS misses the clusters, which the offsets then find.
    embedder = LocusEmbedder(query_encoder=encoder, **TINY_NETWORK).fit(sets)
    labels = np.array([f"topic {c}" for c in cluster], dtype=object)
    return embedder, queries, Y, labels, vectors, cluster


def _router(embedder, **params):
    # Forward passes: refinement would fit what the clusters correct.
    return LocusRouter(FrozenEstimator(embedder), refine_steps=0, **params)


def _fit(pool, train=slice(0, 240), **params):
    embedder, queries, Y, *_ = pool
    router = _router(embedder, **params)
    return router.fit(queries[train], Y.iloc[train])


def _log_loss(router, pool, test=slice(240, None), groups=None):
    _, queries, Y, *_ = pool
    p = router.predict_correctness(queries[test], groups)
    y = Y.iloc[test].to_numpy()
    seen = ~np.isnan(y)
    p = np.clip(p[seen], 1e-6, 1 - 1e-6)
    return -np.mean(y[seen] * np.log(p) + (1 - y[seen]) * np.log(1 - p))


@pytest.mark.slow
def test_clusters_are_chosen_on_held_out_evaluations_and_help(pool):
    assert LocusRouter().query_clusters is None  # clusters are asked for
    clustered = _fit(pool, query_clusters="auto")
    losses = clustered.held_out_losses_
    assert clustered.group_source_ == "clusters"
    tried = [k for k in CLUSTER_GRID if k * QUERIES_PER_CLUSTER <= 240]
    assert tried == [2, 4, 8]
    assert set(losses) == {"none"} | {f"{k} clusters" for k in tried}
    chosen = f"{len(clustered.groups_)} clusters"
    assert losses[chosen] == min(losses.values()) < losses["none"]
    np.testing.assert_array_equal(clustered.groups_, np.arange(len(clustered.groups_)))
    # LOCUS from half the evaluations missed the clusters; from all, it
    # predicts unseen queries nearly as well as the truth allows (0.423 is
    # the entropy of 0.15), and the offsets keep that.
    plain = _fit(pool, query_clusters=None)
    assert plain.groups_ is None and plain.held_out_losses_ is None
    assert losses[chosen] < losses["none"] - 0.1
    assert _log_loss(clustered, pool) < min(_log_loss(plain, pool), 0.45)


@pytest.mark.slow
def test_a_number_of_clusters_is_taken_as_given_and_reproducible(pool):
    *_, vectors, cluster = pool
    router = _fit(pool, query_clusters=N_CLUSTERS)
    assert set(router.held_out_losses_) == {"none", f"{N_CLUSTERS} clusters"}
    assert router.group_offsets_.shape == (12, N_CLUSTERS)
    told = router.stages_.groups.learnt.codes(vectors)
    # The clusters found are the pool's: one found cluster per true one.
    assert pd.crosstab(told, cluster).gt(0).sum(axis=1).eq(1).all()
    again = _fit(pool, query_clusters=N_CLUSTERS)
    np.testing.assert_array_equal(again.group_weights_, router.group_weights_)
    np.testing.assert_array_equal(again.group_offsets_, router.group_offsets_)


def test_clusters_assign_each_query_its_nearest_centre(pool):
    _, queries, *_, vectors, _ = pool
    router = _fit(pool, query_clusters=N_CLUSTERS)
    learnt = router.stages_.groups.learnt
    assert not learnt.soft
    centres = router.group_weights_.astype(np.float64)
    distances = ((vectors[:, None, :] - centres[None]) ** 2).sum(axis=2)
    np.testing.assert_array_equal(learnt.codes(vectors), distances.argmin(axis=1))
    memberships = learnt.memberships(vectors)
    np.testing.assert_array_equal(memberships.sum(axis=1), 1.0)
    # Routing without groups is routing with each query's cluster given.
    test = queries[240:]
    given = learnt.codes(vectors[240:])
    np.testing.assert_allclose(
        router.predict_correctness(test),
        router.predict_correctness(test, query_groups=given),
        rtol=1e-6,
    )


def test_labels_given_at_fit_are_told_from_the_text_at_routing(pool):
    embedder, queries, Y, labels, vectors, _ = pool
    router = _router(embedder, query_clusters=N_CLUSTERS)
    router.fit(queries[:240], Y.iloc[:240], query_groups=labels[:240])
    assert router.group_source_ == "labels" and router.held_out_losses_ is None
    learnt = router.stages_.groups.learnt
    assert learnt.soft
    told = learnt.memberships(vectors[240:])
    np.testing.assert_allclose(told.sum(axis=1), 1.0, rtol=1e-12)
    assert (router.groups_[told.argmax(axis=1)] == labels[240:]).mean() > 0.95
    test = queries[240:]
    without = router.predict_correctness(test)
    with_labels = router.predict_correctness(test, labels[240:])
    assert np.abs(without - with_labels).max() < 0.05
    plain = _fit(pool, query_clusters=None)
    assert _log_loss(router, pool) < min(_log_loss(plain, pool), 0.45)


@pytest.mark.slow
@pytest.mark.parametrize("n_labels", [1, 2])
def test_one_or_two_labels_and_unlabelled_queries(pool, n_labels):
    embedder, queries, Y, labels, vectors, cluster = pool
    given = np.array([f"g{c % n_labels}" for c in cluster], dtype=object)
    given[::7] = None
    router = LocusRouter(FrozenEstimator(embedder))
    router.fit(queries[:240], Y.iloc[:240], query_groups=given[:240])
    told = router.stages_.groups.learnt.memberships(vectors)
    assert told.shape == (len(queries), n_labels)
    np.testing.assert_allclose(told.sum(axis=1), 1.0, rtol=1e-12)
    if n_labels == 2:
        codes = {label: j for j, label in enumerate(router.groups_)}
        truth = np.array([codes[f"g{c % 2}"] for c in cluster])
        assert (told.argmax(axis=1) == truth).mean() > 0.95
    assert np.isfinite(router.predict_correctness(queries[240:])).all()


def test_shifted_adds_weighted_offsets_on_the_logit_scale():
    probabilities = np.array([[0.5, 0.2]])
    memberships = np.array([[0.25, 0.75]])
    offsets = np.array([[1.0, -1.0], [2.0, 0.0]])  # (models, groups)
    moved = shifted(probabilities, memberships, offsets)
    logit = np.log(0.2 / 0.8)
    expected = 1 / (1 + np.exp(-np.array([-0.5, logit + 0.5])))
    np.testing.assert_allclose(moved[0], expected, rtol=1e-6)


def test_held_out_loss_scores_each_half_on_the_other():
    scores = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, np.nan], [0.0, 0.0]])
    half = np.array([[0, 0], [1, 1], [0, -1], [1, 0]], dtype=np.int8)
    zero = np.zeros(scores.shape)
    # LOCUS at p = 0.5 everywhere: log 2 per held-out evaluation.
    assert held_out_loss([zero, zero], scores, half, None, 1.0) == pytest.approx(
        np.log(2)
    )
    # Model 1 has one evaluation in half 1 only of... both halves: all scored.
    with_groups = held_out_loss(
        [zero, zero], scores, half, np.array([0, 1, 0, 1], dtype=object), 1e6
    )
    assert with_groups == pytest.approx(np.log(2), rel=1e-3)  # shrunk to none


def test_onboarded_models_and_new_queries_take_the_clusters(pool):
    _, queries, Y, *_, vectors, _ = pool
    router = _fit(pool, query_clusters=N_CLUSTERS)
    learnt = router.stages_.groups.learnt
    same = {q: s for q, s in zip(queries, Y["m0"]) if s == s}  # new queries too
    router.add_models([same], ["again"])
    kept = list(router.evaluation_queries_)
    codes = learnt.codes(vectors[[queries.index(q) for q in kept]])
    np.testing.assert_array_equal(router.evaluation_groups_, codes)
    assert np.abs(router.group_offsets_[-1]).max() > 0.1
    with pytest.raises(ValueError, match="clusters of its queries"):
        router.partial_fit(queries[:2], Y.iloc[:2], query_groups=["a", "b"])
    router.remove_models(["again"])
    assert router.group_offsets_.shape == (12, N_CLUSTERS)


@pytest.mark.slow
def test_learnt_groups_survive_saving_and_pickling(pool, tmp_path):
    _, queries, Y, labels, *_ = pool
    for router in (
        _fit(pool, query_clusters=N_CLUSTERS),
        LocusRouter(FrozenEstimator(pool[0])).fit(
            queries[:240], Y.iloc[:240], query_groups=labels[:240]
        ),
    ):
        path = tmp_path / "router.sklocus"
        sklocus.save(router, path)
        for again in (sklocus.load(path), pickle.loads(pickle.dumps(router))):
            assert again.group_source_ == router.group_source_
            assert again.held_out_losses_ == router.held_out_losses_
            np.testing.assert_array_equal(
                again.predict_correctness(queries[240:]),
                router.predict_correctness(queries[240:]),
            )


def test_a_format_7_router_reads_without_clusters(pool, tmp_path):
    router = _fit(pool, query_clusters=None)
    path = tmp_path / "router.sklocus"
    sklocus.save(router, path)

    def as_format_7(header):
        as_format_8(header)
        estimator = header["estimator"]
        del estimator["params"]["query_clusters"]
        for name in ("group_source_", "group_weights_", "group_biases_"):
            del estimator["fitted"][name]
        del estimator["fitted"]["held_out_losses_"]
        header["format_version"] = 7

    rewrite(path, as_format_7)
    loaded = sklocus.load(path)
    assert loaded.query_clusters is None and loaded.group_source_ is None
    np.testing.assert_array_equal(
        loaded.predict_correctness(pool[1][240:]),
        router.predict_correctness(pool[1][240:]),
    )
    state = router.__getstate__()
    # A pickle of then: its fitted attributes flat, some not yet there.
    state.update(state.pop("stages_").to_arrays())
    for name in ("query_clusters", "group_source_", "group_weights_"):
        del state[name]
    old = LocusRouter.__new__(LocusRouter)
    old.__setstate__(state)
    assert old.query_clusters is None and old.group_weights_ is None


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda f: f.update(group_source_="topics"), "not 'labels' or 'clusters'"),
        (lambda f: f.update(group_source_=None), "not given together"),
        (
            lambda f: f.update(held_out_losses_={"dict": [["none", "low"]]}),
            "names to finite losses",
        ),
    ],
)
def test_odd_learnt_groups_in_a_file_are_refused(pool, tmp_path, edit, message):
    path = tmp_path / "router.sklocus"
    sklocus.save(_fit(pool, query_clusters=N_CLUSTERS), path)
    rewrite(path, lambda header: edit(holder(header, "group_source_")))
    with pytest.raises(sklocus.ModelFileError, match=message):
        sklocus.load(path)


@pytest.mark.slow
def test_wrongly_shaped_or_infinite_group_weights_are_refused(pool, tmp_path):
    path = tmp_path / "router.sklocus"
    sklocus.save(_fit(pool, query_clusters=N_CLUSTERS), path)

    def grow(header):
        pass

    rewrite(
        path,
        grow,
        lambda arrays: arrays.update(
            {
                name: np.vstack([value, value[:1]])
                for name, value in arrays.items()
                if name.endswith("group_weights_")
            }
        ),
    )
    with pytest.raises(sklocus.ModelFileError, match="group_weights_ are not"):
        sklocus.load(path)
    sklocus.save(_fit(pool, query_clusters=N_CLUSTERS), path)
    rewrite(
        path,
        grow,
        lambda arrays: arrays.update(
            {
                name: np.full_like(value, np.nan)
                for name, value in arrays.items()
                if name.endswith("group_biases_")
            }
        ),
    )
    with pytest.raises(sklocus.ModelFileError, match="NaN or infinite"):
        sklocus.load(path)


@pytest.mark.slow
def test_the_command_line_says_how_groups_were_chosen(pool):
    _, queries, Y, labels, *_ = pool
    line = groups_line(_fit(pool, query_clusters="auto"))
    assert line.startswith("Query groups: ") and "clusters of the query" in line
    assert "held-out" in line
    plain = _fit(pool, query_clusters=None)
    assert groups_line(plain) is None
    given = LocusRouter(FrozenEstimator(pool[0])).fit(
        queries[:240], Y.iloc[:240], query_groups=labels[:240]
    )
    assert "the 4 of the evaluations" in groups_line(given)
