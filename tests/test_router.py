import copy
import dataclasses
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor

import joblib
import numpy as np
import pandas as pd
import pytest
from marks import slow_fixture
from sklearn.base import clone
from sklearn.frozen import FrozenEstimator
from sklearn.model_selection import GridSearchCV, KFold, cross_val_score
from vectors import assert_same_probabilities

import sklocus._router._locus as locus_module
from sklocus import LocusEmbedder, LocusRouter
from sklocus.datasets import make_evaluations

SMALL = dict(
    embedding_dim=32,
    n_latents=8,
    n_layers=1,
    n_heads=2,
    predictor_hidden=32,
    batch_size=4,
    epoch_size=1,
    lr=1e-3,
    predictor_lr=2e-3,
    validation_fraction=None,
    random_state=0,
)


def _score_frame(data, queries):
    row = {q: j for j, q in enumerate(data.query_ids)}
    frame = pd.DataFrame(np.nan, index=range(len(queries)), columns=data.model_names)
    for name, evaluations in zip(data.model_names, data.evaluation_sets):
        for i, query in enumerate(queries):
            if query in evaluations:
                frame.loc[i, name] = evaluations[query]
    assert row  # queries are ids of data
    return frame


@pytest.fixture(scope="module")
def problem():
    data = make_evaluations(
        n_models=16,
        n_queries=700,
        evals_per_model=(350, 650),
        query_dim=16,
        random_state=2,
    )
    rng = np.random.default_rng(0)
    order = rng.permutation(data.query_ids)
    train, test = list(order[:550]), list(order[550:])
    return data, train, _score_frame(data, train), test, _score_frame(data, test)


@slow_fixture(scope="module")
def router(problem):
    data, train, Y, *_ = problem
    embedder = LocusEmbedder(query_encoder=data.encoder, max_epochs=40, **SMALL)
    return LocusRouter(embedder).fit(train, Y, cost=data.params_b)


def test_fit_sets_attributes(router, problem):
    data, *_ = problem
    assert list(router.classes_) == data.model_names
    assert router.embeddings_.shape == (16, 32)
    np.testing.assert_array_equal(router.cost_, data.params_b)
    assert isinstance(router.embedder_, LocusEmbedder)


def test_predictions_and_their_shapes(router, problem):
    data, _, _, test, _ = problem
    p = router.predict_correctness(test[:20])
    assert p.shape == (20, 16) and ((p > 0) & (p < 1)).all()
    chosen = router.predict(test[:20])
    # Utilities within 1e-6 of the best are ties, which go to the first model
    # (models 12 and 14 of this pool tie on some queries).
    first_best = (p >= p.max(axis=1, keepdims=True) - 1e-6).argmax(axis=1)
    np.testing.assert_array_equal(chosen, router.classes_[first_best])
    proba = router.predict_proba(test[:20])
    np.testing.assert_allclose(proba.sum(axis=1), 1.0)
    np.testing.assert_array_equal(proba.argmax(axis=1), p.argmax(axis=1))


def test_score_is_mean_observed_score_of_the_chosen_model(router, problem):
    _, _, _, test, Y_test = problem
    chosen = router.predict(test)
    picked = np.array([Y_test.loc[i, c] for i, c in enumerate(chosen)])
    expected = np.nanmean(picked)
    assert router.score(test, Y_test) == pytest.approx(expected)
    assert router.score(test, Y_test.to_numpy()) == pytest.approx(expected)


def test_routing_beats_the_best_single_model(router, problem):
    data, _, _, test, _ = problem
    columns = [data.query_ids.index(q) for q in test]
    truth = data.probabilities[columns]  # (n_test, n_models)
    chosen = [data.model_names.index(c) for c in router.predict(test)]
    routed = truth[np.arange(len(test)), chosen].mean()
    best_single = truth.mean(axis=0).max()
    assert routed > best_single + 0.03, (routed, best_single)


def test_cost_aware_routing(router, problem):
    data, _, _, test, _ = problem
    p = router.predict_correctness(test)
    expensive = clone(router).set_params(cost_weight=0.3)
    expensive.__dict__.update(
        {k: v for k, v in router.__dict__.items() if k.endswith("_")}
    )
    utility = p - 0.3 * data.params_b / data.params_b.max()
    np.testing.assert_array_equal(
        expensive.predict(test), router.classes_[utility.argmax(axis=1)]
    )

    def mean_cost(r):
        return np.mean(
            [data.params_b[data.model_names.index(c)] for c in r.predict(test)]
        )

    assert mean_cost(expensive) < mean_cost(router)


def _copy(router):
    twin = clone(router)
    twin.__dict__.update(
        {
            k: (v.copy() if hasattr(v, "copy") and k != "embedder_" else v)
            for k, v in router.__dict__.items()
            if k.endswith("_")
        }
    )
    return twin


def _add_a_copy_of_a_chosen_model(router, problem):
    data, train, _, test, _ = problem
    grown = _copy(router)
    before = grown.predict(test)
    source = data.model_names.index(before[0])
    # The evaluations the router embedded that model from: its train queries.
    seen = set(train)
    evaluations = {q: s for q, s in data.evaluation_sets[source].items() if q in seen}
    grown.add_models([evaluations], ["the-copy"], cost=[data.params_b[source]])
    return grown, before, source


def test_adding_an_exact_copy(router, problem):
    test = problem[3]
    grown, before, source = _add_a_copy_of_a_chosen_model(router, problem)
    np.testing.assert_allclose(
        grown.embeddings_[-1], grown.embeddings_[source], rtol=1e-5, atol=1e-6
    )
    np.testing.assert_array_equal(grown.embeddings_[:-1], router.embeddings_)
    assert grown.classes_[-1] == "the-copy" and len(grown.classes_) == 17
    # Routes are compared exactly across pools of 16 and 17 models: a
    # probability may round otherwise in the wider product (within 1e-7,
    # tests/vectors.py), and only utilities that far from the edge of a near-tie
    # (1e-6) could change a route, which does not happen by chance here.
    np.testing.assert_array_equal(grown.predict(test), before)


def test_rounding_noise_does_not_route_to_a_copy(router, problem):
    # A GPU rounds a copy's probabilities differently from the original's (seen on
    # an H200: 3% of queries went to the copy before near-ties counted as ties).
    test = problem[3]
    grown, before, source = _add_a_copy_of_a_chosen_model(router, problem)
    # Every path to LOCUS's probabilities (with query heads too) goes through
    # the embedder's _predict.
    noisy = copy.copy(getattr(grown.embedder_, "estimator", grown.embedder_))
    exact = noisy._predict

    def one_ulp_higher(embeddings, vectors):
        probabilities = exact(embeddings, vectors)
        probabilities[-1] = np.nextafter(
            probabilities[source], np.float32(2), dtype=np.float32
        )
        return probabilities

    noisy._predict = one_ulp_higher
    locus = dataclasses.replace(grown.stages_.locus, embedder=noisy)
    grown.stages_ = grown.stages_.adding(locus=locus)
    np.testing.assert_array_equal(grown.predict(test), before)


def test_remove_and_exclude_models(router, problem):
    _, _, _, test, _ = problem
    chosen = router.predict(test)
    favourite = pd.Series(chosen).value_counts().index[0]
    rerouted = router.predict(test, exclude=[favourite])
    assert favourite not in set(rerouted)
    unchanged = chosen != favourite
    np.testing.assert_array_equal(rerouted[unchanged], chosen[unchanged])
    smaller = _copy(router).remove_models([favourite])
    assert favourite not in smaller.classes_ and len(smaller.classes_) == 15
    # Exact routes from 15 models scored together rather than 16, as in
    # test_adding_an_exact_copy.
    np.testing.assert_array_equal(smaller.predict(test), rerouted)


def test_rank_models_lists_the_choice_first_then_by_utility(router, problem):
    data, _, _, test, _ = problem
    favourite = pd.Series(router.predict(test)).value_counts().index[0]
    for model in (router, _copy(router).set_params(cost_weight=0.3)):
        models, probabilities = model.rank_models(test, k=4, exclude=[favourite])
        assert models.shape == probabilities.shape == (len(test), 4)
        np.testing.assert_array_equal(
            models[:, 0], model.predict(test, exclude=[favourite])
        )
        assert favourite not in set(models.ravel())
        column = {name: j for j, name in enumerate(model.classes_)}
        indices = np.vectorize(column.get)(models)
        p = model.predict_correctness(test)
        np.testing.assert_array_equal(
            probabilities, np.take_along_axis(p, indices, axis=1)
        )
        utility = p - model.cost_weight * data.params_b / data.params_b.max()
        listed = np.take_along_axis(utility, indices, axis=1)
        assert (np.diff(listed[:, 1:], axis=1) <= 0).all()
        assert (listed[:, :1] >= listed[:, 1:] - 1e-6).all()


def test_cost_weight_of_one_call_leaves_the_router_as_it_was(router, problem):
    *_, test, _ = problem
    weighted = _copy(router).set_params(cost_weight=0.3)
    models, probabilities = router.rank_models(test, k=3, cost_weight=0.3)
    expected, expected_p = weighted.rank_models(test, k=3)
    np.testing.assert_array_equal(models, expected)
    np.testing.assert_array_equal(probabilities, expected_p)
    assert router.cost_weight == 0.0
    unweighted, _ = weighted.rank_models(test, k=3, cost_weight=0)
    np.testing.assert_array_equal(unweighted, router.rank_models(test, k=3)[0])
    for bad in (-1, float("nan"), float("inf"), True, "0.3"):
        with pytest.raises(ValueError, match="must be a finite number of at least 0"):
            router.rank_models(test, cost_weight=bad)


@pytest.mark.parametrize("k", [0, 16, 2.0, True])
def test_rank_models_refuses_k_beyond_the_available_models(router, problem, k):
    *_, test, _ = problem
    with pytest.raises(ValueError, match=f"k={k!r}"):
        router.rank_models(test, k=k, exclude=[router.classes_[0]])


def test_an_unfrozen_fitted_embedder_is_refitted_with_a_warning(router, problem):
    _, train, Y, *_ = problem
    with pytest.warns(UserWarning, match="wrap it in sklearn.frozen.FrozenEstimator"):
        refitted = LocusRouter(router.embedder_).fit(train[:40], Y.iloc[:40])
    assert refitted.embedder_ is not router.embedder_


def test_substitutes_are_nearest_others(router):
    name = router.classes_[3]
    substitutes = router.substitutes(name, k=4)
    assert isinstance(substitutes, pd.Series) and len(substitutes) == 4
    assert name not in substitutes.index
    assert substitutes.is_monotonic_increasing
    assert router.substitutes(name, k=100).shape == (15,)


def test_frozen_embedder_only_embeds(router, problem):
    data, train, Y, test, _ = problem
    fitted = router.embedder_
    net = fitted.net_
    frozen = LocusRouter(FrozenEstimator(fitted)).fit(train, Y)
    assert frozen.embedder_.estimator is fitted and fitted.net_ is net
    np.testing.assert_array_equal(frozen.embeddings_, router.embeddings_)
    np.testing.assert_array_equal(frozen.predict(test), router.predict(test))


@pytest.mark.slow
def test_joblib_round_trip_in_a_fresh_process(router, problem, tmp_path):
    _, _, _, test, _ = problem
    path = tmp_path / "router.joblib"
    joblib.dump(router, path)
    expected = router.predict(test)
    np.save(tmp_path / "expected.npy", expected.astype(str))
    script = textwrap.dedent(
        f"""
        import joblib, numpy as np
        router = joblib.load({str(path)!r})
        queries = {test!r}
        assert (router.predict(queries).astype(str) == np.load({str(tmp_path / "expected.npy")!r})).all()
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True)


def test_many_queries_in_chunks(router, problem, monkeypatch):
    _, _, _, test, _ = problem
    queries = [test[i % len(test)] for i in range(100_000)]
    expected = router.predict(test)
    chosen = router.predict(queries)
    # Queries projected in chunks of other sizes round within 1e-7: exact
    # routes, as in test_adding_an_exact_copy; probabilities within rounding.
    np.testing.assert_array_equal(chosen, expected[np.arange(100_000) % len(test)])
    monkeypatch.setattr(locus_module, "QUERY_CHUNK", 7)
    np.testing.assert_array_equal(router.predict(test), expected)
    assert_same_probabilities(
        router.predict_correctness(test[:30]), router.predict_correctness(test)[:30]
    )


def test_concurrent_predict_matches_serial(router, problem):
    _, _, _, test, _ = problem
    slices = [test[i::4] for i in range(4)] * 2
    serial = [router.predict(s) for s in slices]
    with ThreadPoolExecutor(max_workers=4) as pool:
        parallel = list(pool.map(router.predict, slices))
    for a, b in zip(serial, parallel):
        np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_grid_search_and_cross_val_score_over_queries(problem):
    data, train, Y, *_ = problem
    router = LocusRouter(
        LocusEmbedder(query_encoder=data.encoder, **{**SMALL, "max_epochs": 2})
    )
    search = GridSearchCV(router, {"embedder__n_latents": [8, 16]}, cv=KFold(3))
    search.fit(train, Y)
    assert search.best_params_["embedder__n_latents"] in (8, 16)
    results = search.cv_results_
    fold_scores = [
        results[f"split{i}_test_score"][search.best_index_] for i in range(3)
    ]
    assert search.best_score_ == pytest.approx(np.mean(fold_scores))
    assert 0 <= search.best_score_ <= 1
    scores = cross_val_score(router, train, Y, cv=KFold(3))
    assert scores.shape == (3,)


@pytest.mark.slow
def test_array_targets_number_the_models(problem):
    data, train, Y, test, _ = problem
    embedder = LocusEmbedder(query_encoder=data.encoder, **{**SMALL, "max_epochs": 1})
    router = LocusRouter(embedder).fit(train, Y.to_numpy())
    np.testing.assert_array_equal(router.classes_, np.arange(16))
    assert router.predict(test[:5]).dtype.kind == "i"
    router.add_models([data.evaluation_sets[0]], [16])
    assert router.classes_[-1] == 16
    with pytest.raises(TypeError, match="name new models with integers"):
        router.add_models([data.evaluation_sets[0]], ["x"])


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        ("short_x", ValueError, "X has 549 queries but Y has 550 rows"),
        ("empty_model", ValueError, "model 'model-0003' has no observed score in Y"),
        ("negative_cost", ValueError, "model 'model-0002' has cost -1.0"),
        ("short_cost", ValueError, "give one cost per model (16)"),
        ("bad_score", ValueError, "Y's score of model 'model-0001' on query"),
    ],
)
def test_bad_fit_input_is_named(problem, change, error, message):
    data, train, Y, *_ = problem
    Y = Y.copy()
    cost = None
    X = train
    if change == "short_x":
        X = train[:-1]
    elif change == "empty_model":
        Y["model-0003"] = np.nan
    elif change == "negative_cost":
        cost = data.params_b.copy()
        cost[2] = -1.0
    elif change == "short_cost":
        cost = data.params_b[:5]
    elif change == "bad_score":
        Y.loc[Y["model-0001"].first_valid_index(), "model-0001"] = 2.0
    router = LocusRouter(
        LocusEmbedder(query_encoder=data.encoder, **{**SMALL, "max_epochs": 1})
    )
    with pytest.raises(error) as raised:
        router.fit(X, Y, cost=cost)
    assert message in str(raised.value)


def test_bad_names_are_named(router, problem):
    data, _, _, test, Y_test = problem
    with pytest.raises(
        ValueError, match="cannot exclude 'nobody': the router has no such model"
    ):
        router.predict(test, exclude=["nobody"])
    with pytest.raises(ValueError, match="cannot remove 'nobody'"):
        _copy(router).remove_models(["nobody"])
    with pytest.raises(ValueError, match="cannot exclude every model"):
        router.predict(test, exclude=list(router.classes_))
    with pytest.raises(ValueError, match="model 'model-0000' is already in the router"):
        _copy(router).add_models([data.evaluation_sets[0]], ["model-0000"], cost=[1.0])
    with pytest.raises(ValueError, match="give a cost for each new model"):
        _copy(router).add_models([data.evaluation_sets[0]], ["new"])
    with pytest.raises(ValueError, match="the router has no model 'nobody'"):
        router.substitutes("nobody")
    with pytest.raises(ValueError, match="are not the router's models"):
        router.score(test, Y_test.iloc[:, ::-1])


def _frozen(router):
    return LocusRouter(FrozenEstimator(router.embedder_))


def test_y_indexed_by_query_is_matched_to_x_by_label(router, problem):
    _, train, Y, *_ = problem
    by_query = Y.set_axis(train)
    shuffled = by_query.sample(frac=1.0, random_state=0)
    aligned = _frozen(router).fit(train, by_query)
    matched = _frozen(router).fit(train, shuffled)
    np.testing.assert_array_equal(matched.embeddings_, aligned.embeddings_)
    np.testing.assert_array_equal(aligned.embeddings_, router.embeddings_)
    assert router.score(train, shuffled) == router.score(train, by_query)


def test_y_that_does_not_match_x_by_label_is_refused(router, problem):
    _, train, Y, *_ = problem
    by_query = Y.set_axis(train)
    with pytest.raises(ValueError, match=rf"query '{train[0]}' of X is not in Y"):
        _frozen(router).fit(train, by_query.drop(index=train[0]))
    with pytest.raises(ValueError, match=rf"Y's index holds query '{train[0]}', wh"):
        _frozen(router).fit(train[1:], by_query)
    repeated = pd.concat([by_query, by_query.iloc[:1]])
    with pytest.raises(ValueError, match=rf"query '{train[0]}' more than once"):
        _frozen(router).fit(train, repeated)


def test_a_repeated_query_or_model_is_an_error_not_last_one_wins(router, problem):
    data, train, Y, *_ = problem
    with pytest.raises(ValueError, match=rf"query '{train[0]}' is in X more than"):
        _frozen(router).fit([train[0], *train[1:], train[0]], pd.concat([Y, Y[:1]]))
    twice = Y.set_axis([data.model_names[0]] * 2 + data.model_names[2:], axis=1)
    with pytest.raises(ValueError, match=rf"model '{data.model_names[0]}' in more"):
        _frozen(router).fit(train, twice)


def test_sample_weight_of_the_wrong_size_is_named(router, problem):
    _, _, _, test, Y_test = problem
    with pytest.raises(ValueError, match=r"sample_weight has shape \(3,\); give one"):
        router.score(test, Y_test, sample_weight=[1.0, 2.0, 3.0])


def test_score_refuses_scores_outside_zero_one(router, problem):
    # Scores out of range once came back as a "routing accuracy" of 2.0.
    _, _, _, test, Y_test = problem
    Y_bad = Y_test.copy()
    Y_bad.iloc[:, :] = Y_bad.iloc[:, :].where(Y_bad.isna(), 2.0)
    with pytest.raises(ValueError, match=r"Y's score of model .* is 2.0; scores must"):
        router.score(test, Y_bad)


def test_add_models_refuses_a_bare_string_of_names(router, problem):
    data, *_ = problem
    with pytest.raises(TypeError, match=r"sequence of model names.*'xy'"):
        _copy(router).add_models(
            data.evaluation_sets[:2], model_names="xy", cost=[1, 1]
        )


@pytest.mark.slow
def test_cross_val_score_with_the_default_cv(problem):
    data, train, Y, *_ = problem
    router = LocusRouter(
        LocusEmbedder(query_encoder=data.encoder, **{**SMALL, "max_epochs": 1})
    )
    assert Y.isna().to_numpy().any()  # what stratified splitting failed on
    scores = cross_val_score(router, train, Y, cv=3)
    assert scores.shape == (3,) and np.isfinite(scores).all()


def test_costs_follow_one_rule_and_name_the_model():
    from sklocus._validation import check_costs

    names = ["a", "b", "c"]
    np.testing.assert_array_equal(check_costs([0, 1, 2.5], names), [0, 1, 2.5])
    with pytest.raises(ValueError, match="model 'b' has cost -1.0; .* at least 0$"):
        check_costs([0, -1, 2], names)
    with pytest.raises(ValueError, match="model 'a' has cost 0.0; .* positive$"):
        check_costs([0, 1, 2], names, positive=True)
    with pytest.raises(ValueError, match="model 'c' has cost inf"):
        check_costs([1, 1, np.inf], names, missing=True)
    found = check_costs([1, np.nan, 2], names, positive=True, missing=True)
    assert np.isnan(found[1])
    with pytest.raises(ValueError, match="model 'b' has params nan"):
        check_costs([1, np.nan, 2], names, what="params")
    with pytest.raises(ValueError, match=r"shape \(2,\); give one cost per model"):
        check_costs([1, 2], names)


def _train_sets(data, train):
    kept = set(train)
    return [{q: s for q, s in e.items() if q in kept} for e in data.evaluation_sets]


@pytest.mark.parametrize("calibration", [None, "pool"])
def test_fit_evaluations_is_fit_without_the_dense_table(router, problem, calibration):
    data, train, Y, test, _ = problem
    sets = _train_sets(data, train)
    benchmark = dict(zip(data.query_ids, data.benchmarks.tolist()))
    groups = [benchmark[q] for q in train]
    settings = dict(refine_steps=3, calibration=calibration)
    frozen = FrozenEstimator(router.embedder_)
    from_table = LocusRouter(frozen, **settings).fit(
        train, Y, cost=data.params_b, query_groups=groups
    )
    from_sets = LocusRouter(frozen, **settings).fit_evaluations(
        sets, data.model_names, cost=data.params_b, query_groups=benchmark
    )
    assert from_sets.classes_.tolist() == from_table.classes_.tolist()
    np.testing.assert_allclose(from_sets.embeddings_, from_table.embeddings_, atol=1e-5)
    np.testing.assert_array_equal(from_sets.cost_, from_table.cost_)
    # Groups come in order of first appearance, which differs between the two.
    order = [from_table.groups_.tolist().index(g) for g in from_sets.groups_]
    assert sorted(order) == list(range(len(from_table.groups_)))
    np.testing.assert_allclose(
        from_sets.group_offsets_, from_table.group_offsets_[:, order], atol=1e-4
    )
    test_groups = [benchmark[q] for q in test]
    np.testing.assert_allclose(
        from_sets.predict_correctness(test, test_groups),
        from_table.predict_correctness(test, test_groups),
        atol=1e-4,
    )
    if calibration:
        assert from_sets.calibration_slope_ == pytest.approx(
            from_table.calibration_slope_, abs=1e-4
        )


def test_fit_evaluations_numbers_unnamed_models_and_names_bad_input(router, problem):
    data, train, *_ = problem
    sets = _train_sets(data, train)[:4]
    frozen = FrozenEstimator(router.embedder_)
    numbered = LocusRouter(frozen, refine_steps=0).fit_evaluations(sets)
    assert numbered.classes_.tolist() == [0, 1, 2, 3]
    assert numbered.predict(train[:3]).dtype.kind == "i"
    with pytest.raises(ValueError, match="got 3 model names for 4 evaluation sets"):
        LocusRouter(frozen).fit_evaluations(sets, ["a", "b", "c"])
    with pytest.raises(ValueError, match=r"cost has no value for model 'd'"):
        LocusRouter(frozen).fit_evaluations(
            sets, list("abcd"), cost=pd.Series([1.0, 2, 3], index=list("abc"))
        )
    with pytest.raises(TypeError, match="fit_evaluations takes a mapping"):
        LocusRouter(frozen).fit_evaluations(sets, list("abcd"), query_groups=["x"])
    with pytest.raises(ValueError, match="set 2 .*'c'.* is empty"):
        LocusRouter(frozen).fit_evaluations(sets[:2] + [{}] + sets[3:], list("abcd"))
    assert sets[0] == _train_sets(data, train)[0]  # nothing the user gave changed


def test_a_threshold_routes_to_the_cheapest_model_likely_enough(router, problem):
    _, _, _, test, _ = problem
    p = router.predict_correctness(test)
    cost = router.cost_
    for threshold in (0.0, 0.5, 0.7, 0.9, 1.0):
        chosen = router.predict(test, min_probability=threshold)
        for row, model in enumerate(chosen):
            j = list(router.classes_).index(model)
            qualifying = np.flatnonzero(p[row] >= threshold)
            if len(qualifying):
                assert p[row, j] >= threshold
                assert cost[j] == cost[qualifying].min()
            else:
                assert p[row, j] >= p[row].max() - 1e-6
    # The ranking lists the qualifying models by cost, then the others by P.
    models, listed = router.rank_models(test[:20], k=len(cost), min_probability=0.6)
    for names, probabilities in zip(models, listed):
        rows = [list(router.classes_).index(name) for name in names]
        ok = probabilities >= 0.6
        assert not (~ok[:-1] & ok[1:]).any()  # no qualifying model after another
        assert (np.diff(cost[rows][ok]) >= 0).all()
        assert (np.diff(probabilities[~ok]) <= 1e-6).all()


def test_a_threshold_set_on_the_router_and_per_call_agree(router, problem):
    data, train, Y, test, _ = problem
    frozen = FrozenEstimator(router.embedder_)
    thresholded = LocusRouter(frozen, min_probability=0.7).fit(
        train, Y, cost=data.params_b
    )
    expected = router.predict(test, min_probability=0.7)
    np.testing.assert_array_equal(thresholded.predict(test), expected)
    # A call's own policy replaces the router's.
    np.testing.assert_array_equal(
        thresholded.predict(test, cost_weight=0.0), router.predict(test)
    )
    # An unavailable cheapest model gives way to the next that qualifies.
    busiest = pd.Series(expected).value_counts().index[0]
    moved = thresholded.predict(test, exclude=[busiest])
    assert busiest not in set(moved)
    assert (moved[expected != busiest] == expected[expected != busiest]).all()


def test_bad_thresholds_are_named(router, problem):
    data, train, Y, test, _ = problem
    frozen = FrozenEstimator(router.embedder_)
    with pytest.raises(ValueError, match="give one policy"):
        LocusRouter(frozen, cost_weight=0.1, min_probability=0.5).fit(
            train, Y, cost=data.params_b
        )
    with pytest.raises(ValueError, match="which the router was fitted without"):
        LocusRouter(frozen, min_probability=0.5).fit(train, Y)
    with pytest.raises(ValueError, match="min_probability"):
        LocusRouter(frozen, min_probability=1.5).fit(train, Y, cost=data.params_b)
    with pytest.raises(ValueError, match="give one policy"):
        router.predict(test, cost_weight=0.1, min_probability=0.5)
    for bad in (-0.1, 1.1, float("nan"), True, "0.5"):
        with pytest.raises(ValueError, match=r"min_probability=.* must be in \[0, 1\]"):
            router.rank_models(test, min_probability=bad)
    without_costs = LocusRouter(frozen, refine_steps=0).fit(train, Y)
    with pytest.raises(ValueError, match="which the router was fitted without"):
        without_costs.predict(test, min_probability=0.5)


@pytest.fixture(scope="module")
def budgeted(router, problem):
    data, train, Y, *_ = problem
    frozen = FrozenEstimator(router.embedder_)
    cheapest, dearest = data.params_b.min(), data.params_b.max()
    budget = cheapest + 0.3 * (dearest - cheapest)
    return LocusRouter(frozen, budget=budget).fit(train, Y, cost=data.params_b)


def test_a_budget_routes_by_the_best_weight_within_it(budgeted, router, problem):
    data, _, _, test, Y_test = problem
    weights, costs, qualities = budgeted.budget_curve_
    assert weights[0] == 0 and len(weights) == 62 and np.isfinite(weights).all()
    within = costs <= budgeted.budget
    chosen = budgeted.budget_cost_weight_
    assert costs[weights == chosen][0] <= budgeted.budget
    assert qualities[weights == chosen][0] == qualities[within].max()
    # It routes as that weight of cost does, and a call may ask another budget.
    np.testing.assert_array_equal(
        budgeted.predict(test), router.predict(test, cost_weight=chosen)
    )
    generous = budgeted.predict(test, budget=data.params_b.max())
    np.testing.assert_array_equal(
        generous,
        router.predict(test, cost_weight=float(weights[np.argmax(qualities)])),
    )
    # On the test queries the routes keep near the budget: the held-out curve
    # predicted their mean cost.
    spent = pd.Series(data.params_b, index=data.model_names)[budgeted.predict(test)]
    assert spent.mean() <= 1.25 * budgeted.budget


def test_an_unreachable_budget_warns_and_routes_cheaply(router, problem):
    data, train, Y, *_ = problem
    frozen = FrozenEstimator(router.embedder_)
    with pytest.warns(UserWarning, match="no weight of cost kept the mean cost"):
        tight = LocusRouter(frozen, budget=0.0).fit(train, Y, cost=data.params_b)
    weights, costs, _ = tight.budget_curve_
    assert tight.budget_cost_weight_ == weights[np.argmin(costs)]


def test_bad_budgets_are_named(budgeted, router, problem):
    data, train, Y, test, _ = problem
    frozen = FrozenEstimator(router.embedder_)
    with pytest.raises(ValueError, match="give one policy"):
        LocusRouter(frozen, min_probability=0.5, budget=3.0).fit(
            train, Y, cost=data.params_b
        )
    with pytest.raises(ValueError, match="budget=3.0 routes by the models' costs"):
        LocusRouter(frozen, budget=3.0).fit(train, Y)
    with pytest.raises(ValueError, match="fitted without"):
        router.predict(test, budget=3.0)
    with pytest.raises(ValueError, match="give one policy"):
        budgeted.predict(test, budget=3.0, cost_weight=0.1)
    with pytest.raises(ValueError, match=r"budget=-1 must be a finite number"):
        budgeted.predict(test, budget=-1)


def test_a_budgeted_router_file_keeps_its_choice(budgeted, problem, tmp_path):
    import sklocus

    _, _, _, test, _ = problem
    path = tmp_path / "budgeted.sklocus"
    sklocus.save(budgeted, path)
    loaded = sklocus.load(path)
    assert loaded.budget_cost_weight_ == budgeted.budget_cost_weight_
    np.testing.assert_array_equal(loaded.budget_curve_, budgeted.budget_curve_)
    np.testing.assert_array_equal(loaded.predict(test), budgeted.predict(test))
