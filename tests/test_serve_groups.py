"""Query groups in the served router: requests name each query's group."""

import copy
import dataclasses

import numpy as np
import pandas as pd
import pytest
from sklearn.frozen import FrozenEstimator
from tiny import TINY_NETWORK, TINY_POOL, long_table

import sklocus
from sklocus import LocusEmbedder, LocusRouter
from sklocus.datasets import make_evaluations
from sklocus.evaluations import to_matrix

pytest.importorskip("fastapi")
pytest.importorskip("httpx")
from fastapi.testclient import TestClient  # noqa: E402

from sklocus.cli import build_parser, main  # noqa: E402
from sklocus.cli._serve import _router_from  # noqa: E402
from sklocus.serve import RequestError, RouterService, create_app  # noqa: E402


@pytest.fixture(scope="module")
def pool():
    """A router fitted with benchmark groups, and the same router without."""
    data = make_evaluations(**TINY_POOL)
    embedder = LocusEmbedder(query_encoder=data.encoder, **TINY_NETWORK).fit(
        data.evaluation_sets
    )
    scores, queries = to_matrix(data.evaluation_sets)
    Y = pd.DataFrame(scores, columns=data.model_names)
    group_of = {q: f"b{k}" for q, k in zip(data.query_ids, data.benchmarks)}
    groups = [group_of[query] for query in queries]
    grouped = LocusRouter(FrozenEstimator(embedder), refine_steps=0)
    grouped.fit(queries, Y, query_groups=groups)
    plain = LocusRouter(FrozenEstimator(embedder), refine_steps=0, query_clusters=None)
    plain.fit(queries, Y)
    return data, group_of, grouped, plain


@pytest.fixture()
def client(pool):
    return TestClient(create_app(RouterService(pool[2], max_batch=20)))


def _errors(response):
    return [(tuple(e["loc"]), e["msg"]) for e in response.json()["detail"]]


def _asked(data, group_of):
    """Ten queries with their groups; the last two without a known group."""
    queries = data.query_ids[:10]
    return queries, [group_of[q] for q in queries[:8]] + [None, "no-such-group"]


def test_routes_with_groups_are_the_librarys_over_http(client, pool):
    data, group_of, router, _ = pool
    queries, groups = _asked(data, group_of)
    body = {"queries": queries, "k": 4, "query_groups": groups}
    response = client.post("/route", json=body)
    assert response.status_code == 200, response.text
    routes = response.json()["routes"]
    models, p = router.rank_models(queries, k=4, query_groups=groups)
    assert [[c["model"] for c in r["top"]] for r in routes] == models.tolist()
    np.testing.assert_array_equal([[c["p"] for c in r["top"]] for r in routes], p)
    # The groups moved the answer: without them the probabilities differ.
    ungrouped = client.post("/route", json={"queries": queries, "k": 4}).json()
    _, plain_p = router.rank_models(queries, k=4)
    listed = [[c["p"] for c in r["top"]] for r in ungrouped["routes"]]
    np.testing.assert_array_equal(listed, plain_p)
    assert not np.allclose(p[:8], plain_p[:8], atol=1e-3)


def test_predictions_with_groups_are_the_librarys_to_the_bit(client, pool):
    data, group_of, router, plain = pool
    queries, groups = _asked(data, group_of)
    names = data.model_names[2:7]
    body = {"queries": queries, "models": names, "query_groups": groups}
    answer = client.post("/predict", json=body).json()
    expected = router.predict_correctness(queries, groups)[:, 2:7]
    assert answer["models"] == names
    np.testing.assert_array_equal(answer["p"], expected)
    without = plain.predict_correctness(queries)[:, 2:7]
    assert np.abs(expected[:8] - without[:8]).max() > 1e-3
    # No group, or one the router does not know: no offset.
    np.testing.assert_array_equal(expected[8:], without[8:])


def test_predictions_without_groups_are_the_librarys(pool):
    data, _, _, plain = pool
    service = RouterService(plain)
    # Up to 16 short queries are computed in one turn, as the library does:
    # the same arithmetic, to the bit. More are computed 16 at a time, which
    # may round the last bit differently from one product over them all.
    for queries in (data.query_ids[:16], data.query_ids[:30]):
        whole = plain.predict_correctness(queries)
        for columns in ([3, 4, 5], [7], list(range(12))):
            names = [data.model_names[j] for j in columns]
            answer = service.predict(queries, names)["p"]
            if len(queries) <= 16:
                np.testing.assert_array_equal(answer, whole[:, columns])
            else:
                np.testing.assert_allclose(answer, whole[:, columns], rtol=0, atol=1e-6)


def test_health_names_the_groups(client, pool):
    health = client.get("/health").json()
    assert health["groups"] == pool[2].groups_.tolist()
    assert sorted(health["groups"]) == [f"b{k}" for k in range(5)]
    plain = TestClient(create_app(RouterService(pool[3])))
    assert plain.get("/health").json()["groups"] is None


@pytest.mark.parametrize(
    "path, body, loc, message",
    [
        (
            "/route",
            {"queries": ["q00001", "q00002"], "query_groups": ["b1"]},
            ("body", "query_groups"),
            "1 query_groups for 2 queries; give one per query",
        ),
        (
            "/predict",
            {"queries": ["q00001", "q00002"], "query_groups": ["b1", 3]},
            ("body", "query_groups", 1),
            "valid string",
        ),
        (
            "/route",
            {"queries": ["q00001"], "query_groups": [""]},
            ("body", "query_groups", 0),
            "at least 1 character",
        ),
        (
            "/route",
            {"queries": ["q00001"], "query_groups": ["b" * 513]},
            ("body", "query_groups", 0),
            "at most 512 characters",
        ),
        (
            "/route",
            {"queries": ["q00001"], "query_groups": {"q00001": "b1"}},
            ("body", "query_groups"),
            "valid list",
        ),
        (
            "/models",
            {"name": "x", "evaluations": {"q00001": 1.0}, "query_groups": ["b1"]},
            ("body", "query_groups"),
            "valid dictionary",
        ),
        (
            "/models",
            {
                "name": "x",
                "evaluations": {"q00001": 1.0},
                "query_groups": {"q00002": "b1"},
            },
            ("body", "query_groups", "q00002"),
            "'q00002' is not a query of evaluations",
        ),
        (
            "/models",
            {
                "name": "x",
                "evaluations": {"q00001": 1.0},
                "query_groups": {"q" * 100: "b1"},
            },
            (
                "body",
                "query_groups",
                "'qqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqq... (100 characters)",
            ),
            "is not a query of evaluations",
        ),
    ],
)
def test_bad_groups_name_the_field(client, path, body, loc, message):
    response = client.post(path, json=body)
    assert response.status_code == 422
    assert any(where == loc and message in said for where, said in _errors(response)), (
        _errors(response)
    )


@pytest.mark.parametrize(
    "path, body",
    [
        ("/route", {"queries": ["q00001"], "query_groups": ["b1"]}),
        ("/predict", {"queries": ["q00001"], "query_groups": [None]}),
        (
            "/models",
            {"name": "x", "evaluations": {"q00001": 1.0}, "query_groups": {}},
        ),
    ],
)
def test_a_router_fitted_without_groups_refuses_them(pool, path, body):
    client = TestClient(create_app(RouterService(pool[3])))
    response = client.post(path, json=body)
    assert response.status_code == 422
    assert _errors(response) == [
        (
            ("body", "query_groups"),
            "the router was fitted without query groups; leave query_groups out",
        )
    ]


def test_the_service_checks_groups_given_in_python(pool):
    data, _, router, _ = pool
    service = RouterService(router)
    queries = data.query_ids[:3]
    cases = [
        (("b1", "b2"), ("query_groups",), "2 query_groups for 3 queries"),
        ("b1b2b3", ("query_groups",), "query_groups is a str; give a list"),
        (["b1", 3, None], ("query_groups", 1), "group 3 is a int; expected a string"),
    ]
    for groups, field, message in cases:
        for method in (service.route, service.predict):
            with pytest.raises(RequestError, match=message) as caught:
                method(queries, query_groups=groups)
            assert caught.value.field == field
    with pytest.raises(RequestError, match="give a mapping") as caught:
        service.add_model("x", {"q00001": 1.0}, query_groups=["b1"])
    assert caught.value.field == ("query_groups",)


def test_onboarding_fits_the_new_models_offsets_as_the_library_does(pool):
    data, group_of, router, _ = pool
    service = RouterService(router)
    client = TestClient(create_app(service))
    evaluations = data.evaluation_sets[0]
    groups = {q: group_of[q] for q in evaluations}
    body = {"name": "again", "evaluations": evaluations, "query_groups": groups}
    assert client.post("/models", json=body).status_code == 201
    alone = copy.deepcopy(router).add_models(
        [evaluations], ["again"], query_groups=groups
    )
    offsets = service.router.group_offsets_
    np.testing.assert_array_equal(offsets, alone.group_offsets_)
    assert np.abs(offsets[-1]).max() > 1e-2
    # The same evaluations as model 0, embedded alike: its offsets, refitted.
    np.testing.assert_allclose(offsets[-1], offsets[0], atol=1e-5)
    # Without groups the model gets no offsets, as add_models gives it.
    service.add_model("plain", evaluations)
    np.testing.assert_array_equal(service.router.group_offsets_[-1], 0)
    queries = data.query_ids[:5]
    routed = service.predict(queries, ["again"], [group_of[q] for q in queries])
    np.testing.assert_allclose(
        np.array(routed["p"])[:, 0],
        router.predict_correctness(queries, [group_of[q] for q in queries])[:, 0],
        atol=1e-5,
    )


def test_a_router_with_groups_not_named_by_text_is_refused(pool):
    router = copy.copy(pool[2])
    numbered = np.array([0, 1, 2, 3, 4], dtype=object)
    groups = dataclasses.replace(router.stages_.groups, labels=numbered)
    router.stages_ = router.stages_.adding(groups=groups)
    with pytest.raises(ValueError, match="query groups must be named with text"):
        RouterService(router)


# -- sklocus serve --group-column -------------------------------------------------


@pytest.mark.slow
def test_serve_builds_a_grouped_router_from_a_group_column(pool, tmp_path):
    data, group_of, _, _ = pool
    table = long_table(data)
    table["benchmark"] = table["query"].map(group_of)
    table.to_csv(tmp_path / "evals.csv", index=False)
    np.save(tmp_path / "vectors.npy", data.query_vectors)
    (tmp_path / "ids.txt").write_text("\n".join(data.query_ids))
    embedder = pool[2].embedder_.estimator
    sklocus.save(embedder, tmp_path / "embedder.sklocus")
    argv = [
        "serve",
        str(tmp_path / "embedder.sklocus"),
        str(tmp_path / "evals.csv"),
        "--query-vectors",
        str(tmp_path / "vectors.npy"),
        "--query-ids",
        str(tmp_path / "ids.txt"),
        "--group-column",
        "benchmark",
    ]
    router, _ = _router_from(build_parser().parse_args(argv))
    scores, queries = to_matrix(data.evaluation_sets)
    expected = LocusRouter(FrozenEstimator(embedder)).fit(
        queries,
        pd.DataFrame(scores, columns=data.model_names),
        query_groups=[group_of[q] for q in queries],
    )
    assert router.groups_.tolist() == expected.groups_.tolist()
    np.testing.assert_allclose(
        router.group_offsets_, expected.group_offsets_, atol=1e-5
    )
    served = RouterService(router).health()["groups"]
    assert sorted(served) == sorted(set(group_of.values()))


def test_serve_takes_a_group_column_only_with_evals(pool, tmp_path, capsys):
    sklocus.save(pool[3], tmp_path / "router.sklocus")
    status = main(["serve", str(tmp_path / "router.sklocus"), "--group-column", "b"])
    assert status == 2
    assert "argument --group-column: goes with EVALS" in capsys.readouterr().err
