"""LocusRouter.partial_fit: outcomes join their models' evaluations."""

import copy
import json

import numpy as np
import pandas as pd
import pytest
from safetensors import safe_open
from sklearn.frozen import FrozenEstimator
from tiny import SMALL_NETWORK

import sklocus
from sklocus import LocusEmbedder, LocusRouter
from sklocus._persistence import ModelFileError
from sklocus.datasets import make_evaluations
from sklocus.encoders import PrecomputedEncoder


@pytest.fixture(scope="module")
def data():
    return make_evaluations(
        n_models=6, n_queries=240, evals_per_model=None, query_dim=8, random_state=3
    )


@pytest.fixture(scope="module")
def embedder(data):
    return LocusEmbedder(query_encoder=data.encoder, **SMALL_NETWORK).fit(
        data.evaluation_sets
    )


def _table(data, queries, models=None):
    models = data.model_names if models is None else models
    column = {name: j for j, name in enumerate(data.model_names)}
    return pd.DataFrame(
        {
            name: [data.evaluation_sets[column[name]].get(q, np.nan) for q in queries]
            for name in models
        }
    )


def _router(embedder, **params):
    return LocusRouter(FrozenEstimator(embedder), refine_steps=10, **params)


def _snapshot(router):
    """Every public fitted attribute of the router but its embedder, copied."""
    names = [n for n in dir(router) if n.endswith("_") and not n.startswith("_")]
    return {
        name: copy.deepcopy(getattr(router, name))
        for name in names
        if name not in ("embedder_", "stages_")
    }


def _assert_same(before, router):
    for name, value in before.items():
        now = getattr(router, name)
        if isinstance(value, np.ndarray):
            np.testing.assert_array_equal(now, value, err_msg=name)
        else:
            assert now == value, name


def test_a_model_learns_as_a_fresh_fit_on_all_its_evaluations(data, embedder):
    queries = data.query_ids
    first, more = queries[:80], queries[60:200]  # 20 queries are seen twice
    router = _router(embedder, query_heads=False).fit(first, _table(data, first))
    untouched = router.embeddings_[2:].copy()
    router.partial_fit(more, _table(data, more, data.model_names[:2]))

    # The fresh fit sees each pair once: a repeated outcome equals the one
    # before, so their mean is it.
    seen = queries[:200]
    table = _table(data, seen)
    table.loc[80:, data.model_names[2:]] = np.nan
    fresh = _router(embedder, query_heads=False).fit(seen, table)
    np.testing.assert_allclose(router.embeddings_, fresh.embeddings_, atol=2e-5)
    np.testing.assert_array_equal(router.embeddings_[2:], untouched)
    evaluations = router.evaluations()
    repeated = evaluations[evaluations["query"].isin(queries[60:80])]
    assert set(
        repeated.loc[repeated["model"].isin(data.model_names[:2]), "n_outcomes"]
    ) == {2}
    assert set(
        repeated.loc[~repeated["model"].isin(data.model_names[:2]), "n_outcomes"]
    ) == {1}
    counts = evaluations.groupby("model", sort=False).size()
    assert counts.tolist() == [
        sum(q in data.evaluation_sets[j] for q in (seen if j < 2 else first))
        for j in range(6)
    ]


def test_repeated_outcomes_average(data, embedder):
    queries = data.query_ids[:60]
    router = _router(embedder, query_heads=False).fit(queries, _table(data, queries))
    name = data.model_names[0]
    query = next(q for q in queries if q in data.evaluation_sets[0])
    had = data.evaluation_sets[0][query]
    router.partial_fit([query], pd.DataFrame({name: [1.0 - had]}))
    router.partial_fit([query], pd.DataFrame({name: [1.0 - had]}))
    row = router.evaluations().query("model == @name and query == @query")
    assert row["n_outcomes"].tolist() == [3]
    np.testing.assert_allclose(row["score"], (had + 2 * (1 - had)) / 3)


def test_learning_equals_removing_and_adding_the_model(data, embedder):
    """Query heads, calibration and groups are refitted as add_models fits them."""
    queries = data.query_ids
    groups = {q: f"g{i % 3}" for i, q in enumerate(queries)}
    first = queries[:150]
    settings = dict(query_heads=True, calibration="pool")
    router = _router(embedder, **settings).fit(
        first, _table(data, first), query_groups=[groups[q] for q in first]
    )
    more = queries[150:240]
    name = data.model_names[3]
    router.partial_fit(
        more, _table(data, more, [name]), query_groups=[groups[q] for q in more]
    )
    other = _router(embedder, **settings).fit(
        first, _table(data, first), query_groups=[groups[q] for q in first]
    )
    other.remove_models([name]).add_models(
        [data.evaluation_sets[3]], [name], query_groups=groups
    )
    row = list(router.classes_).index(name)
    for attribute in (
        "embeddings_",
        "model_offsets_",
        "head_weights_",
        "group_offsets_",
    ):
        np.testing.assert_allclose(
            getattr(router, attribute)[row],
            getattr(other, attribute)[-1],
            atol=1e-4,
            err_msg=attribute,
        )
    assert router.head_blends_[row] == other.head_blends_[-1]


def test_the_arrays_of_a_snapshot_are_never_written_into(data, embedder):
    queries = data.query_ids[:100]
    router = _router(embedder, query_heads=True).fit(queries, _table(data, queries))
    snapshot = copy.copy(router)
    before = _snapshot(router)
    more = data.query_ids[100:140]
    router.partial_fit(more, _table(data, more, data.model_names[:1]))
    _assert_same(before, snapshot)
    assert not np.array_equal(router.embeddings_[0], snapshot.embeddings_[0])


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda Y: Y.rename(columns={"model-0000": "gpt-9"}),
            r"outcomes of model 'gpt-9', which the router does not have",
        ),
        (lambda Y: Y.assign(**{"model-0001": 1.5}), r"model .model-0001. .* is 1.5"),
        (lambda Y: Y.to_numpy()[:, :2], r"Y has 2 columns but the router has 6 models"),
    ],
)
def test_bad_outcomes_are_refused_and_change_nothing(data, embedder, change, message):
    queries = data.query_ids[:50]
    router = _router(embedder, query_heads=False).fit(queries, _table(data, queries))
    before = _snapshot(router)
    more = data.query_ids[50:60]
    with pytest.raises(ValueError, match=message):
        router.partial_fit(more, change(_table(data, more)))
    _assert_same(before, router)


def test_an_unknown_query_is_refused_and_changes_nothing(data, embedder):
    queries = data.query_ids[:50]
    router = _router(embedder, query_heads=False).fit(queries, _table(data, queries))
    before = _snapshot(router)
    Y = pd.DataFrame({data.model_names[0]: [1.0, 0.0]})
    with pytest.raises(ValueError, match="not-a-query"):
        router.partial_fit([data.query_ids[60], "not-a-query"], Y)
    _assert_same(before, router)


def test_query_groups_keep_their_queries(data, embedder):
    queries = data.query_ids[:60]
    router = _router(embedder, query_heads=False).fit(
        queries, _table(data, queries), query_groups=["a"] * 30 + ["b"] * 30
    )
    Y = pd.DataFrame({data.model_names[0]: [1.0]})
    with pytest.raises(ValueError, match=r"is in group 'a', not 'b'"):
        router.partial_fit(queries[:1], Y, query_groups=["b"])
    router.partial_fit([data.query_ids[70]], Y, query_groups=["b"])
    position = router.evaluation_queries_.tolist().index(data.query_ids[70])
    assert router.groups_[router.evaluation_groups_[position]] == "b"
    plain = _router(embedder, query_heads=False, query_clusters=None)
    plain.fit(queries, _table(data, queries))
    with pytest.raises(ValueError, match="fitted without query_groups"):
        plain.partial_fit(queries[:1], Y, query_groups=["a"])


def test_an_unfitted_router_is_fitted_and_nothing_observed_changes_nothing(
    data, embedder
):
    queries = data.query_ids[:60]
    learnt = _router(embedder, query_heads=False).partial_fit(
        queries, _table(data, queries)
    )
    fitted = _router(embedder, query_heads=False).fit(queries, _table(data, queries))
    np.testing.assert_array_equal(learnt.embeddings_, fitted.embeddings_)
    before = _snapshot(learnt)
    learnt.partial_fit(queries[:3], pd.DataFrame({data.model_names[0]: [np.nan] * 3}))
    _assert_same(before, learnt)


def test_removing_and_adding_models_keeps_the_evaluations_in_step(data, embedder):
    queries = data.query_ids[:80]
    router = _router(embedder, query_heads=False).fit(queries, _table(data, queries))
    router.remove_models(data.model_names[:2])
    evaluations = router.evaluations()
    assert evaluations["model"].unique().tolist() == data.model_names[2:]
    assert set(router.evaluation_queries_) == set(evaluations["query"])
    extra = {q: 1.0 for q in data.query_ids[200:210]}
    router.add_models([extra], ["new"])
    added = router.evaluations().query("model == 'new'")
    assert added["query"].tolist() == list(extra)
    assert router.evaluation_offsets_[-1] == len(router.evaluation_codes_)


def test_evaluations_survive_a_model_file_and_learning_goes_on(
    data, embedder, tmp_path
):
    queries = data.query_ids[:80]
    groups = ["a" if i % 2 else None for i in range(80)]
    router = _router(embedder, query_heads=False).fit(
        queries, _table(data, queries), query_groups=groups
    )
    path = tmp_path / "router.sklocus"
    sklocus.save(router, path)
    loaded = sklocus.load(path)
    pd.testing.assert_frame_equal(loaded.evaluations(), router.evaluations())
    more = data.query_ids[80:120]
    for r in (router, loaded):
        r.partial_fit(more, _table(data, more, data.model_names[1:3]))
    np.testing.assert_array_equal(loaded.embeddings_, router.embeddings_)
    np.testing.assert_array_equal(loaded.group_offsets_, router.group_offsets_)


def test_a_model_file_with_inconsistent_evaluations_is_refused(
    data, embedder, tmp_path
):
    queries = data.query_ids[:40]
    router = _router(embedder, query_heads=False).fit(queries, _table(data, queries))
    router.evaluation_offsets_ = router.evaluation_offsets_[::-1].copy()
    path = tmp_path / "router.sklocus"
    sklocus.save(router, path)
    with pytest.raises(ModelFileError, match="evaluation_offsets_"):
        sklocus.load(path)


@pytest.mark.slow
def test_long_query_texts_are_kept_in_a_tensor_not_the_header(data, tmp_path):
    texts = [f"{q}: " + "a question that goes on " * 200 for q in data.query_ids]
    vectors = data.encoder.transform(data.query_ids)
    encoder = PrecomputedEncoder(texts, vectors)
    embedder = LocusEmbedder(query_encoder=encoder, **SMALL_NETWORK)
    Y = _table(data, data.query_ids)
    # Numpy's strings (np.str_) are texts too.
    router = LocusRouter(embedder, refine_steps=0, query_heads=False).fit(
        np.array(texts), Y
    )
    assert type(router.evaluation_queries_[0]) is np.str_
    path = tmp_path / "router.sklocus"
    sklocus.save(router, path)
    with safe_open(path, "numpy") as file:
        stored = set(file.keys())
        header = json.loads(file.metadata()["sklocus"])
    assert "LocusRouter.evaluation_queries_.utf8" in stored
    described = header["estimator"]["fitted"]["evaluation_queries_"]
    assert described == {
        "texts": [
            "LocusRouter.evaluation_queries_.utf8",
            "LocusRouter.evaluation_queries_.ends",
        ]
    }
    loaded = sklocus.load(path)
    assert loaded.evaluation_queries_.tolist() == router.evaluation_queries_.tolist()
    assert loaded.evaluation_queries_.dtype == object


def test_outcomes_one_by_one_are_learnt_as_a_table_of_them(data, embedder):
    queries = data.query_ids[:80]
    router = _router(embedder).fit(queries, _table(data, queries))
    from_table = copy.deepcopy(router)
    more = data.query_ids[70:120]  # ten queries known, forty new
    Y = _table(data, more, data.model_names[:3])
    from_table.partial_fit(more, Y)
    rows, columns = np.nonzero(~np.isnan(Y.to_numpy()))
    router.learn_outcomes(
        Y.columns[columns], [more[i] for i in rows], Y.to_numpy()[rows, columns]
    )
    _assert_same(_snapshot(from_table), router)


@pytest.mark.parametrize(
    ("models", "scores", "message"),
    [
        (["model-0000", "gpt-9"], [1.0, 0.0], r"outcome 1 is of model 'gpt-9'"),
        (["model-0000"] * 2, [1.0, 1.5], r"outcome 1 has score 1.5 \(out of range\)"),
        (["model-0000"] * 2, [1.0, "yes"], r"outcome 1 has score 'yes'"),
        (["model-0000"], [1.0, 0.0], r"got 1, 2 and \(2,\)"),
    ],
)
def test_bad_outcomes_one_by_one_are_named_and_change_nothing(
    data, embedder, models, scores, message
):
    queries = data.query_ids[:50]
    router = _router(embedder, query_heads=False).fit(queries, _table(data, queries))
    before = _snapshot(router)
    with pytest.raises(ValueError, match=message):
        router.learn_outcomes(models, data.query_ids[50:52], scores)
    _assert_same(before, router)


def test_a_known_query_regrouped_raises_or_keeps_its_group(data, embedder):
    queries = data.query_ids[:60]
    router = _router(embedder, query_heads=False).fit(
        queries, _table(data, queries), query_groups=["a"] * 30 + ["b"] * 30
    )
    assert router.named_groups().tolist() == ["a", "b"]
    model = data.model_names[0]
    with pytest.raises(ValueError, match=r"is in group 'a', not 'b'"):
        router.learn_outcomes([model], queries[:1], [1.0], {queries[0]: "b"})
    router.learn_outcomes(
        [model, model],
        [queries[0], data.query_ids[70]],
        [1.0, 0.0],
        {queries[0]: "b", data.query_ids[70]: "b"},
        group_conflicts="ignore",
    )
    groups = router.groups_[router.evaluation_groups_]
    known = router.evaluation_queries_.tolist()
    assert groups[known.index(queries[0])] == "a"
    assert groups[known.index(data.query_ids[70])] == "b"
    with pytest.raises(ValueError, match="group_conflicts='keep' must be"):
        router.learn_outcomes([model], queries[:1], [1.0], group_conflicts="keep")


def test_clusters_are_no_groups_to_give(data, embedder):
    queries = data.query_ids[:120]
    router = _router(embedder, query_heads=False, query_clusters=2)
    router.fit(queries, _table(data, queries))
    assert router.group_source_ == "clusters" and router.named_groups() is None
    with pytest.raises(ValueError, match="leave query_groups out"):
        router.learn_outcomes(
            [data.model_names[0]], queries[:1], [1.0], {queries[0]: 0}
        )


def test_evaluation_counts_follow_the_outcomes(data, embedder):
    queries = data.query_ids[:50]
    table = _table(data, queries)
    router = _router(embedder, query_heads=False).fit(queries, table)
    counts = router.evaluation_counts()
    assert counts.index.tolist() == list(data.model_names)
    assert counts["n_evaluations"].tolist() == table.notna().sum().tolist()
    assert (counts["n_scores"] == counts["n_evaluations"]).all()
    model = data.model_names[1]
    observed = table[model].notna().to_numpy()
    known = [q for q, seen in zip(queries, observed) if seen][0]
    router.learn_outcomes([model, model], [known, data.query_ids[60]], [1.0, 0.0])
    after = router.evaluation_counts().loc[model]
    assert after["n_evaluations"] == counts.loc[model, "n_evaluations"] + 1
    assert after["n_scores"] == counts.loc[model, "n_scores"] + 2


def test_copies_of_a_loaded_router_draw_on_from_one_random_state(
    data, embedder, tmp_path
):
    queries = data.query_ids[:50]
    router = _router(embedder, exploration="thompson", random_state=0)
    sklocus.save(router.fit(queries, _table(data, queries)), tmp_path / "r.sklocus")
    loaded = sklocus.load(tmp_path / "r.sklocus")
    first, second = copy.copy(loaded), copy.copy(loaded)
    test = data.query_ids[100:160]
    # One random state: the second copy's draws follow the first's, as one
    # router's two calls do, instead of repeating them.
    drawn = [first.predict(test), second.predict(test)]
    alone = sklocus.load(tmp_path / "r.sklocus")
    assert np.array_equal(drawn[0], alone.predict(test))
    assert np.array_equal(drawn[1], alone.predict(test))
    assert not np.array_equal(drawn[0], drawn[1])
