"""Property-based tests: any input either works or is refused with a named culprit."""

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from sklearn.base import clone
from tiny import TINY_NETWORK, TINY_POOL

from sklocus import LocusEmbedder
from sklocus.datasets import make_evaluations
from sklocus.evaluations import check_evaluation_sets

# Derandomised: CI runs the same examples every time, so a failure reproduces.
FUZZ = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)

keys = st.one_of(
    st.text(max_size=6),
    st.integers(-3, 3),
    st.none(),
    st.just(float("nan")),
    st.floats(allow_nan=False, width=32),
    st.tuples(st.text(max_size=2), st.integers(0, 2)),
)
values = st.one_of(
    st.floats(),
    st.integers(-2, 2),
    st.booleans(),
    st.text(max_size=3),
    st.none(),
    st.lists(st.integers(), max_size=2),
)
sets = st.one_of(
    st.dictionaries(keys, values, max_size=6),
    st.text(max_size=3),
    st.integers(),
    st.none(),
)


@pytest.mark.slow
@FUZZ
@given(st.lists(sets, max_size=4))
@example([{"": None, None: []}])  # once raised numpy's inhomogeneous-shape error
def test_evaluation_sets_are_accepted_or_refused_by_name(evaluation_sets):
    try:
        ragged = check_evaluation_sets(evaluation_sets)
    except (TypeError, ValueError) as error:
        message = str(error)
        assert message
        if evaluation_sets and all(isinstance(s, dict) for s in evaluation_sets):
            # Every set is a mapping, so the fault lies in one set: name it.
            assert "evaluation set" in message
        return
    assert ragged.n_sets == len(evaluation_sets)
    assert ragged.sizes.tolist() == [len(s) for s in evaluation_sets]
    assert ((ragged.scores >= 0) & (ragged.scores <= 1)).all()
    for i, evaluation_set in enumerate(evaluation_sets):
        expected = [float(v) for v in evaluation_set.values()]
        assert ragged.set_scores(i).tolist() == expected
        assert all(not math.isnan(v) for v in expected)


@pytest.fixture(scope="module")
def embedder_and_data():
    data = make_evaluations(**TINY_POOL)
    embedder = LocusEmbedder(query_encoder=data.encoder, **TINY_NETWORK)
    embedder.fit(data.evaluation_sets)
    return embedder, data


def _evaluation_set(data):
    return st.lists(
        st.tuples(st.sampled_from(data.query_ids), st.sampled_from([0.0, 0.5, 1.0])),
        min_size=1,
        max_size=40,
        unique_by=lambda pair: pair[0],
    ).map(dict)


@pytest.mark.slow
@FUZZ
@given(st.data())
def test_transform_is_permutation_invariant_batch_independent_and_type_blind(
    embedder_and_data, draw
):
    embedder, data = embedder_and_data
    evaluation_set = draw.draw(_evaluation_set(data))
    other = draw.draw(_evaluation_set(data))
    items = list(evaluation_set.items())
    shuffled = dict(draw.draw(st.permutations(items)))
    alone = embedder.transform([evaluation_set])
    np.testing.assert_allclose(embedder.transform([shuffled]), alone, atol=1e-5)
    in_a_batch = embedder.transform([other, evaluation_set, other])[1:2]
    np.testing.assert_allclose(in_a_batch, alone, atol=1e-5)
    as_series = embedder.transform([pd.Series(evaluation_set)])
    np.testing.assert_array_equal(as_series, alone)


# -- embeddings: geometry and selectors ------------------------------------------------

FAST = settings(FUZZ, max_examples=40)

numbers_or_junk = st.one_of(
    st.floats(width=32),
    st.integers(-3, 3),
    st.sampled_from(["x", None, "1.5"]),
)
embeddings = st.one_of(
    st.integers(0, 6).flatmap(
        lambda n: st.integers(0, 3).flatmap(
            lambda d: st.lists(
                st.lists(st.floats(-4, 4, width=32), min_size=d, max_size=d),
                min_size=n,
                max_size=n,
            )
        )
    ),
    st.lists(st.lists(numbers_or_junk, max_size=3), max_size=4),
    st.sampled_from(["abc", None, 3, [1.0, 2.0]]),
)
metrics = st.sampled_from(["cosine", "euclidean", "manhattan", None])
# What a message must mention: the argument at fault.
CULPRITS = (
    "embeddings",
    "X",
    "metric",
    "k=",
    "'k'",
    "threshold",
    "n_clusters",
    "n_selected",
    "max_total_cost",
    "cost",
    "sample",
    "feature",
)


def _refused_by_name(error):
    message = str(error)
    assert any(culprit in message for culprit in CULPRITS), message


@pytest.mark.slow
@FAST
@given(embeddings, metrics, st.integers(-1, 7), st.floats(-1, 2))
def test_geometry_works_or_names_the_culprit(Z, metric, k, threshold):
    from sklocus.geometry import (
        cluster_models,
        find_duplicates,
        model_distances,
        nearest_models,
    )

    try:
        distances = model_distances(Z, metric=metric)
    except (TypeError, ValueError) as error:
        _refused_by_name(error)
        return
    n = len(distances)
    assert distances.shape == (n, n)
    assert np.isfinite(distances).all() and (distances >= 0).all()
    assert (np.diag(distances) == 0).all()
    for call in (
        lambda: nearest_models(Z, k=k, metric=metric),
        lambda: find_duplicates(Z, threshold, metric=metric),
        lambda: cluster_models(Z, n_clusters=k, metric=metric),
    ):
        try:
            call()
        except (TypeError, ValueError) as error:
            _refused_by_name(error)


@FAST
@given(
    embeddings,
    metrics,
    st.one_of(st.integers(-1, 8), st.floats(-1, 9), st.just(np.int64(2))),
    st.one_of(st.none(), st.lists(st.floats(-1, 5), max_size=7)),
)
def test_selectors_work_or_name_the_culprit(Z, metric, size, cost):
    from sklocus import CoverageGreedySelector, KCenterSelector, KMedoidsSelector

    for selector, fit_args in (
        (KCenterSelector(n_selected=size, metric=metric), {}),
        (KMedoidsSelector(n_selected=size, metric=metric, random_state=0), {}),
        (CoverageGreedySelector(max_total_cost=size, metric=metric), {"cost": cost}),
    ):
        try:
            selector.fit(Z, **fit_args)
        except (TypeError, ValueError) as error:
            _refused_by_name(error)
            continue
        chosen = selector.selected_indices_
        assert len(set(chosen.tolist())) == len(chosen)
        assert ((0 <= chosen) & (chosen < len(selector.labels_))).all()
        distances = selector.transform(Z)
        assert distances.shape == (len(selector.labels_), len(chosen))
        assert (selector.predict(Z) == selector.labels_).all()


# -- long tables and matrices ------------------------------------------------------------

cells = st.one_of(
    st.sampled_from([0.0, 1.0, 0.5, float("nan"), 2.0, -1.0, "a", None, True])
)


@FAST
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["m1", "m2", 3, None, float("nan")]),
            st.sampled_from(["q1", "q2", "q3", 7, None]),
            cells,
        ),
        max_size=8,
    ),
    st.sampled_from(["error", "mean", "majority", "first"]),
    st.one_of(st.none(), st.just("q1"), st.lists(st.sampled_from(["q1", "q3", 7]))),
)
def test_long_tables_and_matrices_work_or_name_the_culprit(rows, duplicates, queries):
    from sklocus.evaluations import from_long, to_matrix

    frame = pd.DataFrame(rows, columns=["model", "query", "score"])
    try:
        sets, names = from_long(frame, duplicates=duplicates)
    except (TypeError, ValueError) as error:
        message = str(error)
        assert any(
            word in message
            for word in ("model", "query", "score", "duplicates", "frame")
        ), message
        return
    assert len(sets) == len(names) == frame["model"].nunique()
    assert sum(len(s) for s in sets) == len(frame[["model", "query"]].drop_duplicates())
    try:
        matrix, columns = to_matrix(sets, queries=queries, model_names=names)
    except (TypeError, ValueError) as error:
        assert "queries" in str(error), str(error)
        assert queries == "q1"  # a bare string is refused, lists are not
        return
    assert matrix.shape == (len(columns), len(sets))
    for i, evaluation_set in enumerate(sets):
        for j, query in enumerate(columns):
            if query in evaluation_set:
                assert matrix[j, i] == evaluation_set[query]
            else:
                assert np.isnan(matrix[j, i])


# -- the router -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def router_and_data(embedder_and_data):
    from sklearn.frozen import FrozenEstimator

    from sklocus import LocusRouter
    from sklocus.evaluations import to_matrix

    embedder, data = embedder_and_data
    scores, queries = to_matrix(data.evaluation_sets)
    Y = pd.DataFrame(scores, columns=data.model_names)
    router = LocusRouter(FrozenEstimator(embedder)).fit(queries, Y)
    return router, data, queries


score_cells = st.sampled_from([0.0, 1.0, 0.5, float("nan"), float("nan"), 2.0, -1.0])


@settings(FUZZ, max_examples=12)
@given(st.data())
def test_router_fit_works_or_names_the_culprit(router_and_data, draw):
    router, data, queries = router_and_data
    n_queries = draw.draw(st.integers(0, 6))
    picked = draw.draw(
        st.lists(
            st.sampled_from([*queries[:10], "unknown", None]),
            min_size=n_queries,
            max_size=n_queries,
        )
    )
    n_models = draw.draw(st.integers(0, 3))
    Y = np.array(
        draw.draw(
            st.lists(
                st.lists(score_cells, min_size=n_models, max_size=n_models),
                min_size=n_queries,
                max_size=n_queries,
            )
        ),
        dtype=float,
    ).reshape(n_queries, n_models)
    names = draw.draw(
        st.lists(st.sampled_from(["a", "b", "c"]), min_size=n_models, max_size=n_models)
    )
    try:
        fitted = clone(router).fit(picked, pd.DataFrame(Y, columns=names))
    except (TypeError, ValueError) as error:
        message = str(error)
        assert any(w in message for w in ("query", "model", "Y", "score")), message
        return
    assert list(fitted.classes_) == names
    assert fitted.predict(picked).shape == (n_queries,)


@pytest.mark.slow
@FAST
@given(st.data())
def test_router_predict_score_and_add_models_work_or_name_the_culprit(
    router_and_data, draw
):
    router, data, queries = router_and_data
    asked = draw.draw(
        st.one_of(
            st.lists(st.sampled_from([*queries[:20], "unknown", 5]), max_size=5),
            st.sampled_from(["q00001", None, 3]),
        )
    )
    try:
        routes = router.predict(asked)
    except (TypeError, ValueError) as error:
        assert "quer" in str(error), str(error)
    else:
        assert set(routes.tolist()) <= set(router.classes_.tolist())
        n = len(asked)
        Y = np.array(
            draw.draw(
                st.lists(
                    st.lists(score_cells, min_size=12, max_size=12),
                    min_size=n,
                    max_size=n,
                )
            ),
            dtype=float,
        ).reshape(n, 12)
        weights = draw.draw(st.one_of(st.none(), st.lists(st.floats(0, 2), max_size=4)))
        try:
            value = router.score(
                asked, pd.DataFrame(Y, columns=router.classes_), weights
            )
        except (TypeError, ValueError) as error:
            message = str(error)
            assert any(w in message for w in ("score", "Y", "sample_weight")), message
        else:
            assert 0 <= value <= 1
    new_sets = draw.draw(st.lists(st.one_of(_evaluation_set(data), sets), max_size=2))
    names = draw.draw(
        st.one_of(
            st.lists(
                st.sampled_from(["new1", "new2", data.model_names[0]]), max_size=2
            ),
            st.just("xy"),
        )
    )
    grown = clone(router)
    grown.__dict__.update(router.__dict__)
    try:
        grown.add_models(new_sets, names)
    except (TypeError, ValueError) as error:
        message = str(error)
        assert any(w in message for w in ("model", "evaluation set", "names")), message
        return
    assert (
        len(grown.classes_)
        == len(router.classes_) + len(new_sets)
        == len(grown.embeddings_)
    )
    np.testing.assert_array_equal(
        grown.embeddings_[: len(router.classes_)], router.embeddings_
    )


# -- the embedder's other entry points ------------------------------------------------


@FAST
@given(st.data())
def test_predict_correctness_and_subsample_work_or_name_the_culprit(
    embedder_and_data, draw
):
    from sklocus.evaluations import subsample

    embedder, data = embedder_and_data
    Z = draw.draw(embeddings)
    queries = draw.draw(
        st.one_of(
            st.lists(st.sampled_from([*data.query_ids[:5], "unknown", 3]), max_size=4),
            st.sampled_from(["q00001", None, 7]),
        )
    )
    try:
        p = embedder.predict_correctness(Z, queries)
    except (TypeError, ValueError) as error:
        message = str(error)
        assert any(w in message for w in ("embeddings", "quer")), message
    else:
        assert p.shape == (len(queries), len(Z))
        assert ((0 <= p) & (p <= 1)).all()
    sets_drawn = draw.draw(st.lists(_evaluation_set(data), min_size=1, max_size=3))
    n = draw.draw(st.one_of(st.integers(-1, 50), st.floats(0, 2), st.just("5")))
    shared = draw.draw(st.booleans())
    try:
        drawn = subsample(sets_drawn, n, random_state=0, shared=shared)
    except (TypeError, ValueError) as error:
        message = str(error)
        assert any(w in message for w in ("n=", "n ", "evaluation set")), message
        return
    for original, smaller in zip(sets_drawn, drawn):
        assert smaller.items() <= original.items()
        assert len(smaller) == min(n, len(original)) or shared
