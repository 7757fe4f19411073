"""What the model map shows, checked in Python (the browser test checks the page)."""

import json

import numpy as np
import pandas as pd
import pytest
from tiny import TINY_NETWORK

from sklocus import LocusEmbedder
from sklocus.datasets import make_evaluations
from sklocus.evaluations import to_matrix
from sklocus.geometry import nearest_models
from sklocus.report import map_data


@pytest.fixture(scope="module")
def trained():
    data = make_evaluations(
        n_models=40,
        n_queries=300,
        evals_per_model=(60, 300),
        query_dim=16,
        random_state=0,
    )
    test = data.query_ids[250:]
    train_sets = [
        {q: s for q, s in e.items() if q not in set(test)} for e in data.evaluation_sets
    ]
    settings = {**TINY_NETWORK, "max_epochs": 3, "epoch_size": 256}
    embedder = LocusEmbedder(query_encoder=data.encoder, **settings).fit(train_sets)
    return data, test, train_sets, embedder


@pytest.fixture(scope="module")
def pool(trained):
    data, test, train_sets, embedder = trained
    Z = embedder.transform(train_sets)
    groups = {q: f"benchmark {b}" for q, b in zip(data.query_ids, data.benchmarks)}
    metadata = pd.DataFrame({"params_b": data.params_b, "family": data.families})
    page = map_data(
        Z,
        data.model_names,
        evaluation_sets=data.evaluation_sets,
        embedder=embedder,
        query_groups=groups,
        metadata=metadata,
        test_queries=test,
        max_portfolio=12,
        convergence_sizes=(8, 32, 128),
    )
    return data, Z, test, page


def test_the_page_data_is_json_with_one_entry_per_model(pool):
    data, Z, _, page = pool
    json.dumps(page, allow_nan=False)  # no NaN: the page parses it as JSON
    n = len(data.model_names)
    assert page["models"] == data.model_names
    assert np.shape(page["xyz"]) == (n, 3)
    assert len(page["colour"]["values"]) == n
    assert max(page["colour"]["values"]) < len(page["colour"]["labels"])
    assert page["metadata"]["params_b"] == pytest.approx(list(data.params_b))
    assert page["groups"] == [f"benchmark {b}" for b in range(5)]
    assert np.shape(page["accuracy"]) == (n, 5)


def test_neighbours_are_the_nearest_with_their_disagreement(pool):
    data, Z, _, page = pool
    indices, distances = nearest_models(Z, k=10)
    scores, _ = to_matrix(data.evaluation_sets)
    for i in (0, 7):
        listed = page["neighbours"][i]
        assert [j for j, *_ in listed] == indices[i].tolist()
        assert [d for _, d, _ in listed] == pytest.approx(distances[i], abs=1e-4)
        j = listed[0][0]
        shared = ~np.isnan(scores[i]) & ~np.isnan(scores[j])
        expected = np.abs(scores[i, shared] - scores[j, shared]).mean()
        assert listed[0][2] == pytest.approx(expected, abs=1e-4)


def test_planted_copies_are_near_duplicates_both_ways(pool):
    data, _, _, page = pool
    copies = np.flatnonzero(data.duplicate_of >= 0)
    found = [i for i in copies if data.duplicate_of[i] in page["duplicates"][i]]
    assert found, "no planted copy was flagged"
    for i, others in enumerate(page["duplicates"]):
        assert all(i in page["duplicates"][j] for j in others)


def test_portfolios_grow_one_model_at_a_time_with_their_routing(pool):
    _, _, _, page = pool
    portfolio = page["portfolio"]
    assert portfolio["max_k"] == 12
    for method in ("k-center", "coverage"):
        order = portfolio["orders"][method]
        assert len(order) == 12 and len(set(order)) == 12
        routing = portfolio["routing"][method]
        assert len(routing) == 12 and all(0 <= r <= 1 for r in routing)
    assert 0 < portfolio["full_pool"] <= 1


def test_convergence_shrinks_as_evaluations_are_added(pool):
    data, _, _, page = pool
    convergence = page["convergence"]
    assert convergence["n"] == [8, 32, 128]
    distance = np.array(convergence["distance"], dtype=float)
    assert distance.shape == (len(data.model_names), 3)
    sizes = np.array(page["n_evaluations"])
    np.testing.assert_array_equal(np.isnan(distance[:, 2]), sizes <= 128)
    means = np.nanmean(distance, axis=0)
    assert means[0] > means[1] > means[2]


def test_colour_by_a_metadata_column():
    Z = np.random.default_rng(0).normal(size=(30, 4))
    names = [f"m{i}" for i in range(30)]
    family = pd.DataFrame({"family": ["a", "b", "c"] * 10, "size": np.arange(30.0)})
    page = map_data(Z, names, metadata=family, colour="family")
    assert page["colour"] == {
        "by": "family",
        "values": [0, 1, 2] * 10,
        "labels": ["a", "b", "c"],
    }
    by_size = map_data(Z, names, metadata=family, colour="size")["colour"]
    assert len(by_size["labels"]) == 5  # many numbers: quantiles
    many = family.assign(name=[f"n{i % 15}" if i < 15 else "n0" for i in range(30)])
    by_name = map_data(Z, names, metadata=many, colour="name")["colour"]
    assert len(by_name["labels"]) == 12 and "other" in by_name["labels"]
    assert page["n_evaluations"] is None and page["convergence"] is None
    assert page["portfolio"]["full_pool"] is None


@pytest.mark.parametrize(
    "change, message",
    [
        ({"model_names": ["a", "b"]}, "got 6 embeddings but 2 model names"),
        ({"model_names": ["a"] * 6}, "model 'a' is named twice"),
        ({"metadata": pd.DataFrame({"x": [1]})}, "metadata has 1 rows"),
        ({"colour": "size"}, "colour='size' is neither 'cluster' nor a metadata"),
        ({"n_neighbours": 0}, "n_neighbours=0 must be at least 1"),
    ],
)
def test_bad_input_is_named(change, message):
    arguments = {
        "embeddings": np.random.default_rng(0).normal(size=(6, 3)),
        "model_names": [f"m{i}" for i in range(6)],
    }
    arguments.update(change)
    with pytest.raises(ValueError, match=message):
        map_data(**arguments)


def test_static_figures_of_families_and_convergence(pool):
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    from sklocus.report import plot_convergence, plot_families

    data, Z, _, page = pool
    ax = plot_families(Z, data.model_names, n_clusters=4)
    assert len(ax.get_xticklabels()) == len(data.model_names)
    assert ax.get_title() == "40 models in 4 families"
    ax = plot_convergence(page, models=data.model_names[:2])
    labels = [line.get_label() for line in ax.get_lines()]
    assert labels == [*data.model_names[:2], "median model"]
    median = ax.get_lines()[-1].get_ydata()
    assert median[0] > median[-1]
    with pytest.raises(ValueError, match="model 'ghost' is not in the map"):
        plot_convergence(page, models=["ghost"])
    with pytest.raises(ValueError, match="data has no convergence"):
        plot_convergence({**page, "convergence": None})


def test_convergence_of_a_sample_of_a_large_pool(pool, trained):
    data, Z, test, _ = pool
    page = map_data(
        Z,
        data.model_names,
        evaluation_sets=data.evaluation_sets,
        embedder=trained[3],
        test_queries=test,
        convergence_sizes=(8, 32),
        convergence_models=10,
    )
    measured = [
        any(v is not None for v in row) for row in page["convergence"]["distance"]
    ]
    assert sum(measured) == 10
