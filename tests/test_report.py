"""What the model map shows, checked in Python (the browser test checks the page)."""

import json

import numpy as np
import pandas as pd
import pytest
from marks import slow_fixture
from sklearn.frozen import FrozenEstimator
from tiny import TINY_NETWORK

from sklocus import CoverageGreedySelector, LocusEmbedder, LocusRouter
from sklocus.datasets import load_llmrouter, make_evaluations
from sklocus.encoders import PrecomputedEncoder
from sklocus.evaluations import to_matrix
from sklocus.geometry import nearest_models
from sklocus.metrics import routing_accuracy
from sklocus.report import map_data
from sklocus.report._assemble import default_sizes, routing_order


@slow_fixture(scope="module")
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
    # Two models of unknown size: left out of the portfolios within a total cost.
    metadata.loc[[3, 17], "params_b"] = np.nan
    page = map_data(
        Z,
        data.model_names,
        evaluation_sets=data.evaluation_sets,
        embedder=embedder,
        query_groups=groups,
        metadata=metadata,
        test_queries=test,
        cost="params_b",
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
    assert len(page["color"]["values"]) == n
    assert max(page["color"]["values"]) < len(page["color"]["labels"])
    sizes = [None if i in (3, 17) else p for i, p in enumerate(data.params_b)]
    assert page["metadata"]["params_b"] == pytest.approx(sizes)
    assert page["groups"] == [f"benchmark {b}" for b in range(5)]
    assert np.shape(page["accuracy"]) == (n, 5)


def test_neighbours_are_the_nearest_with_their_disagreement(pool):
    data, Z, _, page = pool
    indices, distances = nearest_models(Z, k=10)
    scores = to_matrix(data.evaluation_sets)[0].T  # a row per model
    for i in (0, 7):
        listed = page["neighbors"][i]
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
    data, _, test, page = pool
    portfolio = page["portfolio"]
    assert portfolio["max_k"] == 12
    # The page opens on the first method, greedy routing, at about sqrt(40).
    assert list(portfolio["orders"]) == ["routing", "k-center", "coverage"]
    assert portfolio["default_k"] == 6
    evaluated = {q for e in data.evaluation_sets for q in e}
    assert portfolio["n_held_out"] == len(set(test) & evaluated)
    for method in ("routing", "k-center", "coverage"):
        order = portfolio["orders"][method]
        assert len(order) == 12 and len(set(order)) == 12
        routing = portfolio["routing"][method]
        assert len(routing) == 12 and all(0 <= r <= 1 for r in routing)
    assert 0 < portfolio["full_pool"] <= 1


def test_the_maps_routing_is_the_routers_score_on_the_held_out_queries(trained, pool):
    # The router sklocus route builds, over the evaluations outside the test
    # queries, scored on them: the figure route and fit print.
    data, test, train_sets, embedder = trained
    router = LocusRouter(FrozenEstimator(embedder)).fit_evaluations(
        train_sets, data.model_names
    )
    held = [
        {q: s for q, s in e.items() if q in set(test)} for e in data.evaluation_sets
    ]
    scores, queries = to_matrix(held)
    Y = pd.DataFrame(scores, columns=data.model_names)
    portfolio = pool[3]["portfolio"]
    assert portfolio["full_pool"] == round(router.score(queries, Y), 4)
    first = portfolio["orders"]["k-center"][:3]
    probabilities = router.predict_correctness(queries)
    expected = routing_accuracy(scores[:, first], probabilities[:, first])
    assert portfolio["routing"]["k-center"][2] == round(expected, 4)


def test_default_sizes_scale_with_the_pool():
    assert default_sizes(2) == (2, 1)
    assert default_sizes(9) == (3, 3)
    assert default_sizes(112) == (8, 11)
    assert default_sizes(5949) == (8, 50)
    assert default_sizes(5949, max_portfolio=20) == (8, 20)


def test_routing_order_starts_from_the_strongest_and_adds_what_routes_best():
    scores = np.array(
        [
            [1.0, 1.0, 1.0, 0.0, 0.0, 0.0],  # strongest on half the queries
            [0.0, 0.0, 0.0, 1.0, 1.0, 0.0],  # strong where model 0 is weak
            [1.0, 1.0, 1.0, 0.0, 0.0, 0.0],  # a copy of model 0: adds nothing
            [0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
        ]
    )
    # Probabilities that know where each model is right; the copy is as sure
    # as the original, so routing never sends anything its way.
    probabilities = 0.2 + 0.6 * scores
    order = routing_order(scores, probabilities, max_k=4)
    # Model 1 alone scores 2/6 to model 0's 3/6; with model 0 it lifts routing
    # to 5/6, which the copy of model 0 and the weakest model leave as it is.
    assert order[:2] == [0, 1]
    assert sorted(order) == [0, 1, 2, 3]
    # Each prefix routes as well as routing_accuracy says it does.
    kept = order[:2]
    assert routing_accuracy(scores[kept].T, probabilities[kept].T) == 5 / 6


@slow_fixture(scope="module")
def llmrouter_map():
    """The map of the 9 LLMRouter models, on the source's own test split.

    The texts are not encoded (a minute and a half): each question gets a random
    vector, and the embedder trains for a second. The routing portfolio's first
    model is the strongest whatever the predictions are, which is what the
    test below relies on.
    """
    data = load_llmrouter()
    queries = data.queries["query_id"].tolist()
    vectors = np.random.default_rng(0).normal(size=(len(queries), 8))
    encoder = PrecomputedEncoder(queries, vectors.astype(np.float32))
    test = set(data.queries.loc[data.queries["split"] == "test", "query_id"])
    train = [
        {q: s for q, s in e.items() if q not in test} for e in data.evaluation_sets
    ]
    embedder = LocusEmbedder(query_encoder=encoder, **TINY_NETWORK).fit(train)
    page = map_data(
        embedder.transform(train),
        data.model_names,
        evaluation_sets=data.evaluation_sets,
        embedder=embedder,
        test_queries=sorted(test),
        convergence_sizes=(),
    )
    return data, train, page


def test_the_default_portfolio_of_the_llmrouter_map_has_its_strongest_model(
    llmrouter_map,
):
    data, train, page = llmrouter_map
    accuracy = [np.mean(list(e.values())) for e in train]
    strongest = int(np.argmax(accuracy))
    assert data.model_names[strongest] == "llama-3.1-nemotron-51b-instruct"
    portfolio = page["portfolio"]
    assert portfolio["default_k"] == 3 and portfolio["n_held_out"] == 500
    method = next(iter(portfolio["orders"]))  # the page's default
    chosen = portfolio["orders"][method][: portfolio["default_k"]]
    assert chosen[0] == strongest
    # 9 models are coloured in 3 clusters, not 8.
    assert len(page["color"]["labels"]) == 3


def test_portfolios_within_a_ladder_of_total_costs(pool):
    data, Z, _, page = pool
    ladder = page["portfolio"]["cost_ladder"]
    assert ladder["by"] == "params_b" and ladder["n_priced"] == 38
    values = ladder["max_total_cost"]
    assert values == sorted(values) and len(set(values)) == len(values) > 3
    priced = np.array([i for i in range(40) if i not in (3, 17)])
    cost = np.asarray(data.params_b, dtype=float)
    for max_total_cost, chosen, spent, routing in zip(
        values, ladder["selections"], ladder["total_cost"], ladder["routing"]
    ):
        assert not {3, 17} & set(chosen)
        assert spent == pytest.approx(cost[chosen].sum(), abs=1e-4)
        assert spent <= max_total_cost
        # The selector's own choice among the priced models, not a copy of it.
        selector = CoverageGreedySelector(max_total_cost=max_total_cost).fit(
            Z[priced], cost=cost[priced]
        )
        assert chosen == priced[selector.selected_indices_].tolist()
        assert routing is None or 0 <= routing <= 1
    # Each total buys a different portfolio; the largest buys more models.
    selections = ladder["selections"]
    assert all(a != b for a, b in zip(selections, selections[1:]))
    assert len(selections[-1]) > len(selections[0])


def test_a_map_without_costs_offers_no_cost_ladder():
    Z = np.random.default_rng(0).normal(size=(8, 3))
    page = map_data(Z, [f"m{i}" for i in range(8)])
    assert page["portfolio"]["cost_ladder"] is None
    equal = map_data(Z, [f"m{i}" for i in range(8)], cost=np.ones(8))
    ladder = equal["portfolio"]["cost_ladder"]
    # With equal costs a total cost is a number of models: each buys more, up to
    # every model (max_portfolio is above 8), and none is a repeat.
    sizes = [len(s) for s in ladder["selections"]]
    assert sizes == sorted(set(sizes)) and sizes[0] == 1 and sizes[-1] == 8
    assert ladder["by"] == "cost"


def test_the_reliability_of_held_out_predictions(pool):
    data, Z, test, page = pool
    reliability = page["reliability"]
    counts = np.array(reliability["counts"])
    assert counts.sum() == sum(q in set(test) for e in data.evaluation_sets for q in e)
    assert len(reliability["predicted"]) == len(reliability["observed"]) == len(counts)
    assert all(0 <= p <= 1 for p in reliability["predicted"] + reliability["observed"])
    gaps = np.abs(np.subtract(reliability["predicted"], reliability["observed"]))
    assert reliability["ece"] == pytest.approx(gaps @ counts / counts.sum(), abs=1e-3)


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


def test_color_by_a_metadata_column():
    Z = np.random.default_rng(0).normal(size=(30, 4))
    names = [f"m{i}" for i in range(30)]
    family = pd.DataFrame({"family": ["a", "b", "c"] * 10, "size": np.arange(30.0)})
    page = map_data(Z, names, metadata=family, color="family")
    assert page["color"] == {
        "by": "family",
        "values": [0, 1, 2] * 10,
        "labels": ["a", "b", "c"],
    }
    by_size = map_data(Z, names, metadata=family, color="size")["color"]
    assert len(by_size["labels"]) == 5  # many numbers: quantiles
    many = family.assign(name=[f"n{i % 15}" if i < 15 else "n0" for i in range(30)])
    by_name = map_data(Z, names, metadata=many, color="name")["color"]
    assert len(by_name["labels"]) == 12 and "other" in by_name["labels"]
    assert page["n_evaluations"] is None and page["convergence"] is None
    assert page["portfolio"]["full_pool"] is None and page["reliability"] is None


@pytest.mark.parametrize(
    "change, message",
    [
        ({"model_names": ["a", "b"]}, "got 6 embeddings but 2 model names"),
        ({"model_names": ["a"] * 6}, "model 'a' is named twice"),
        ({"metadata": pd.DataFrame({"x": [1]})}, "metadata has 1 rows"),
        ({"color": "size"}, "color='size' is neither 'cluster' nor a metadata"),
        ({"n_neighbors": 0}, "n_neighbors=0 must be a positive integer"),
        ({"cost": "params"}, "cost='params' is not a metadata column"),
        ({"cost": [1, 2, 3]}, r"cost has shape \(3,\); give one cost per model \(6\)"),
        ({"cost": [1, 2, -1, 1, 1, 1]}, "model 'm2' has cost -1.0; costs must be"),
        ({"cost": [np.nan] * 6}, "no model has a known cost"),
        (
            {"cost": "size", "metadata": pd.DataFrame({"size": [1, 2, "7B", 1, 1, 1]})},
            "model 'm2' has size '7B'; a cost must be a number",
        ),
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


def test_options_that_find_nothing_to_act_on_say_so(trained):
    data, test, train_sets, embedder = trained
    Z = embedder.transform(train_sets)
    common = {"evaluation_sets": data.evaluation_sets, "convergence_sizes": ()}
    # Groups keyed by something other than the evaluations' queries (their
    # texts, say) would draw an empty chart.
    with pytest.raises(ValueError, match="query_groups gives a group to none of"):
        map_data(Z, data.model_names, query_groups={"text 1": "a"}, **common)
    with pytest.raises(ValueError, match="none of the 2 test_queries is evaluated"):
        map_data(
            Z, data.model_names, embedder=embedder, test_queries=["x", "y"], **common
        )


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


def test_the_page_script_is_valid_javascript():
    # The script is a file of its own so that tools read it as JavaScript; node
    # --check parses it without running it. The browser tests run it.
    import shutil
    import subprocess
    from importlib import resources

    node = shutil.which("node")
    if node is None:
        pytest.skip("Node.js is not installed; tests/test_report_browser.py runs it")
    script = resources.files("sklocus.report") / "page" / "map.js"
    result = subprocess.run(
        [node, "--check", str(script)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr


def test_the_page_holds_its_style_script_and_data_inline():
    from sklocus.report._html import render_html

    data = {"sklocus_version": "9.9", "title": "t", "models": []}
    page = render_html(data, title="a <map>")
    assert "<title>a &lt;map&gt;</title>" in page
    assert "window.sklocusMap" in page  # the script
    assert "grid-template-columns" in page  # the style
    assert '"sklocus_version":"9.9"' in page
    assert "@SCRIPT@" not in page and "@STYLE@" not in page
