"""The served router: its service in process, and the real server over HTTP."""

import copy
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pandas as pd
import pytest
from sklearn.frozen import FrozenEstimator
from tiny import TINY_NETWORK
from vectors import assert_same_probabilities

import sklocus
from sklocus import LocusEmbedder, LocusRouter
from sklocus.datasets import make_evaluations
from sklocus.evaluations import to_matrix


def _require(module):
    """Import the serve extra's module, or skip; on CI a missing one fails."""
    try:
        return __import__(module)
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail(f"CI is set but {module} (the serve extra) is missing")
        pytest.skip(f"{module} is missing: pip install 'sklocus[serve]'")


_require("fastapi")
_require("httpx")
import httpx  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402

from sklocus.serve import (  # noqa: E402
    RequestError,
    RouterService,
    ServerLimits,
    create_app,
)

# Most tests start the HTTP server in a process of its own.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def pool():
    data = make_evaluations(
        n_models=16,
        n_queries=160,
        evals_per_model=(40, 120),
        query_dim=8,
        random_state=0,
    )
    newcomers = make_evaluations(
        n_models=6,
        n_queries=160,
        evals_per_model=(40, 120),
        query_dim=8,
        random_state=1,
    )
    embedder = LocusEmbedder(query_encoder=data.encoder, **TINY_NETWORK).fit(
        data.evaluation_sets
    )
    scores, queries = to_matrix(data.evaluation_sets)
    Y = pd.DataFrame(scores, columns=data.model_names)
    # Forward-pass embeddings (refine_steps=0): the concurrency test onboards
    # while 32 clients route, and refinement's 50 autograd steps then wait behind
    # the routing threads for torch's CPU threads, past a minute on 2 cores.
    router = LocusRouter(FrozenEstimator(embedder), refine_steps=0)
    router.fit(queries, Y, cost=data.params_b)
    return data, newcomers, router


@pytest.fixture(scope="module")
def router_file(pool, tmp_path_factory):
    path = tmp_path_factory.mktemp("serve") / "router.sklocus"
    sklocus.save(pool[2], path)
    return path


@pytest.fixture()
def client(pool):
    return TestClient(create_app(RouterService(pool[2], max_batch=50)))


def _errors(response):
    return [(tuple(e["loc"]), e["msg"]) for e in response.json()["detail"]]


# -- in process -----------------------------------------------------------------


def test_route_lists_the_routers_ranking(client, pool):
    data, _, router = pool
    queries = data.query_ids[:7]
    response = client.post("/route", json={"queries": queries, "k": 4})
    assert response.status_code == 200
    routes = response.json()["routes"]
    models, p = router.rank_models(queries, k=4)
    assert [r["query"] for r in routes] == queries
    assert [r["model"] for r in routes] == models[:, 0].tolist()
    for route, row, chances in zip(routes, models, p):
        assert [c["model"] for c in route["top"]] == row.tolist()
        assert [c["p"] for c in route["top"]] == pytest.approx(chances.tolist())


def test_route_takes_exclusions_and_a_cost_weight(client, pool):
    data, _, router = pool
    queries = data.query_ids[:20]
    favourite = pd.Series(router.predict(queries)).value_counts().index[0]
    body = {"queries": queries, "exclude": [favourite], "cost_weight": 0.5}
    routes = client.post("/route", json=body).json()["routes"]
    expected, _ = router.rank_models(queries, k=3, exclude=[favourite], cost_weight=0.5)
    assert [r["model"] for r in routes] == expected[:, 0].tolist()
    assert all(favourite not in [c["model"] for c in r["top"]] for r in routes)
    assert all(len(r["top"]) == 3 for r in routes)  # up to 3 by default


def test_route_takes_a_threshold(client, pool):
    data, _, router = pool
    queries = data.query_ids[:20]
    body = {"queries": queries, "min_probability": 0.6, "k": 2}
    routes = client.post("/route", json=body).json()["routes"]
    expected, _ = router.rank_models(queries, k=2, min_probability=0.6)
    assert [[c["model"] for c in r["top"]] for r in routes] == expected.tolist()
    both = client.post(
        "/route", json={"queries": queries, "min_probability": 0.6, "cost_weight": 0}
    )
    assert both.status_code == 422
    unbudgeted = client.post("/route", json={"queries": queries, "budget": 3})
    assert unbudgeted.status_code == 422
    assert _errors(unbudgeted)[0][0] == ("body", "budget")
    assert "this one was fitted without" in _errors(unbudgeted)[0][1]
    assert _errors(both) == [
        (
            ("body", "min_probability"),
            "cost_weight=0.0 and min_probability=0.6: give one policy (a weight of "
            "cost, a threshold or a budget), not several",
        )
    ]


def test_predict_gives_p_correct_per_query_and_model(client, pool):
    data, _, router = pool
    names = data.model_names[3:6]
    body = {"queries": data.query_ids[:5], "models": names}
    answer = client.post("/predict", json=body).json()
    assert answer["models"] == names and answer["queries"] == data.query_ids[:5]
    expected = router.predict_correctness(data.query_ids[:5])[:, 3:6]
    np.testing.assert_allclose(answer["p"], expected, rtol=1e-6)
    every = client.post("/predict", json={"queries": data.query_ids[:2]}).json()
    assert every["models"] == data.model_names and np.shape(every["p"]) == (2, 16)


def test_models_health_and_the_offline_openapi_page(client, pool):
    data, _, router = pool
    listed = client.get("/models").json()
    assert listed["n_models"] == 16
    assert [m["name"] for m in listed["models"]] == data.model_names
    assert [m["cost"] for m in listed["models"]] == pytest.approx(router.cost_)
    health = client.get("/health").json()
    assert health["status"] == "ok" and health["n_models"] == 16
    schema = client.get("/openapi.json").json()
    assert {"/route", "/predict", "/models", "/models/{name}", "/health"} <= set(
        schema["paths"]
    )
    page = client.get("/docs").text
    assert "swagger-ui-bundle.js" in page and "cdn" not in page.lower()
    assert client.get("/static-offline-docs/swagger-ui-bundle.js").status_code == 200


def test_onboarding_and_removal_change_only_the_pool(pool):
    data, newcomers, router = pool
    service = RouterService(router)
    client = TestClient(create_app(service))
    queries = data.query_ids[:30]
    before = client.post("/predict", json={"queries": queries}).json()["p"]
    body = {
        "name": "new/model",
        "evaluations": newcomers.evaluation_sets[0],
        "cost": 3.5,
    }
    response = client.post("/models", json=body)
    assert response.status_code == 201
    assert response.json() == {
        "model": "new/model",
        "n_evaluations": len(newcomers.evaluation_sets[0]),
        "n_models": 17,
    }
    after = client.post("/predict", json={"queries": queries}).json()
    # Nothing else moved: the old models keep their embeddings to the bit (they
    # are copied), and so their probabilities, up to the rounding of a matrix
    # product that stacks 17 models rather than 16.
    np.testing.assert_array_equal(service.router.embeddings_[:16], router.embeddings_)
    assert_same_probabilities(np.array(after["p"])[:, :16], before)
    # The served router onboards as the router itself does (refined embeddings).
    alone = copy.deepcopy(router).add_models(
        [newcomers.evaluation_sets[0]], ["new/model"], cost=[3.5]
    )
    np.testing.assert_array_equal(service.router.embeddings_[-1], alone.embeddings_[-1])
    assert router.classes_.tolist() == data.model_names  # the original is untouched
    removed = client.delete("/models/new/model")  # a name with a slash
    assert removed.json() == {"model": "new/model", "n_models": 16}
    assert client.get("/health").json()["n_models"] == 16


@pytest.mark.parametrize(
    "path, body, status, loc, message",
    [
        ("/route", {"query": ["q00001"]}, 422, ("body", "query"), "Extra inputs"),
        ("/route", {"queries": []}, 422, ("body", "queries"), "queries is empty"),
        ("/route", {"queries": ["q1"] * 51}, 422, ("body", "queries"), "at most 50"),
        ("/route", {"queries": [""]}, 422, ("body", "queries", 0), "at least 1"),
        ("/route", {"queries": [7]}, 422, ("body", "queries", 0), "valid string"),
        (
            "/route",
            {"queries": ["q00001", "nope"]},
            422,
            ("body", "queries", 1),
            "'nope' (position 1) is not one of the 160 queries",
        ),
        (
            "/route",
            {"queries": ["q00001"], "exclude": ["ghost"]},
            422,
            ("body", "exclude", 0),
            "'ghost' is not a model",
        ),
        (
            "/route",
            {"queries": ["q00001"], "k": 17},
            422,
            ("body", "k"),
            "expected 1 to 16",
        ),
        (
            "/route",
            {"queries": ["q00001"], "cost_weight": -1},
            422,
            ("body", "cost_weight"),
            "cost_weight=-1.0 must be a finite number of at least 0",
        ),
        (
            "/route",
            {"queries": ["q00001"], "min_probability": 1.5},
            422,
            ("body", "min_probability"),
            "min_probability=1.5 must be in [0, 1]",
        ),
        (
            "/predict",
            {"queries": ["q00001"], "models": ["model-0001", "ghost"]},
            422,
            ("body", "models", 1),
            "'ghost' is not a model",
        ),
        (
            "/models",
            {"name": "model-0001", "evaluations": {"q00001": 1}, "cost": 1},
            409,
            ("body", "name"),
            "already served",
        ),
        (
            "/models",
            {"name": "x", "evaluations": {"q00001": 1.5}, "cost": 1},
            422,
            ("body", "evaluations"),
            "score 1.5",
        ),
        (
            "/models",
            {"name": "x", "evaluations": {"q00001": 1}},
            422,
            ("body", "cost"),
            "give this model's cost",
        ),
        (
            "/models",
            {"name": "x", "evaluations": {}, "cost": 1},
            422,
            ("body", "evaluations"),
            "evaluations is empty",
        ),
    ],
)
def test_bad_requests_name_the_field(client, path, body, status, loc, message):
    response = client.post(path, json=body)
    assert response.status_code == status
    assert any(where == loc and message in said for where, said in _errors(response)), (
        _errors(response)
    )


def test_removal_of_unknown_or_last_models(pool):
    data, _, router = pool
    client = TestClient(create_app(RouterService(router)))
    response = client.delete("/models/ghost")
    assert response.status_code == 404
    assert _errors(response) == [(("path", "name"), "no model 'ghost'")]
    for name in data.model_names[:-1]:
        assert client.delete(f"/models/{name}").status_code == 200
    last = client.delete(f"/models/{data.model_names[-1]}")
    assert last.status_code == 409 and "the last model" in _errors(last)[0][1]


def test_bodies_over_the_route_s_limit_are_refused_unread(pool):
    data, newcomers, router = pool
    limits = ServerLimits(max_body_bytes=100_000, max_open_body_bytes=500)
    client = TestClient(create_app(RouterService(router), limits=limits))
    big = {"queries": ["q00001"] * 200}
    response = client.post("/route", json=big)
    assert response.status_code == 413
    assert _errors(response) == [(("body",), "the request body is over 500 bytes")]
    assert response.headers["connection"] == "close"  # the body was not read
    # Onboarding, which needs the token when there is one, may send more.
    evaluations = newcomers.evaluation_sets[1]
    onboarding = {"name": "fresh", "evaluations": evaluations, "cost": 2.0}
    assert len(json.dumps(onboarding)) > 500
    assert client.post("/models", json=onboarding).status_code == 201

    def chunks():  # no Content-Length: the limit counts while reading
        for _ in range(50):
            yield b" " * 100

    chunked = client.post(
        "/route", content=chunks(), headers={"content-type": "application/json"}
    )
    assert chunked.status_code == 413


def test_write_back_saves_each_change_atomically(pool, tmp_path):
    data, newcomers, router = pool
    path = tmp_path / "served.sklocus"
    sklocus.save(router, path)
    service = RouterService(sklocus.load(path), path=path, write_back=True)
    client = TestClient(create_app(service))
    body = {"name": "fresh", "evaluations": newcomers.evaluation_sets[1], "cost": 2.0}
    assert client.post("/models", json=body).status_code == 201
    reloaded = sklocus.load(path)
    assert reloaded.classes_[-1] == "fresh" and reloaded.cost_[-1] == 2.0
    np.testing.assert_array_equal(reloaded.embeddings_, service.router.embeddings_)
    client.delete(f"/models/{data.model_names[0]}")
    assert data.model_names[0] not in sklocus.load(path).classes_
    assert sorted(p.name for p in tmp_path.iterdir()) == ["served.sklocus"]


def test_torch_work_runs_on_one_thread_whoever_calls(pool, monkeypatch):
    """Routing, prediction and the warm-up compute on the one router thread,
    from any caller (torch then keeps one OpenMP pool, whose threads stay
    awake between operations); an onboarding on a thread that then ends."""
    data, newcomers, router = pool
    seen = []

    def recorded(name):
        method = getattr(LocusRouter, name)

        def wrapper(self, *args, **kwargs):
            seen.append((name, threading.current_thread()))
            return method(self, *args, **kwargs)

        return wrapper

    for name in ["rank_models", "predict_correctness", "add_models"]:
        monkeypatch.setattr(LocusRouter, name, recorded(name))
    service = RouterService(router)
    other = RouterService(router)
    service.warm_up()
    service.route(data.query_ids[:2])
    with ThreadPoolExecutor(max_workers=2) as callers:
        callers.submit(other.route, data.query_ids[:2]).result()
        callers.submit(service.predict, data.query_ids[:2]).result()
    client = TestClient(create_app(service))
    assert client.post("/route", json={"queries": data.query_ids[:2]}).status_code
    assert client.post("/predict", json={"queries": data.query_ids[:2]}).status_code
    reading = [thread for name, thread in seen if name != "add_models"]
    assert len(reading) == 6 and len(set(reading)) == 1
    assert reading[0] is not threading.current_thread()
    assert reading[0].name.startswith("sklocus-router")
    service.add_model("newcomer", newcomers.evaluation_sets[0], 1.0)
    onboarding = seen[-1][1]
    assert seen[-1][0] == "add_models"
    assert onboarding not in (reading[0], threading.current_thread())
    assert not onboarding.is_alive()
    # An error raised on the router thread still reaches the caller, blamed
    # on the field at fault.
    with pytest.raises(RequestError) as raised:
        service.route([data.query_ids[0], "no such query"])
    assert raised.value.field[0] == "queries"


def test_service_refuses_what_it_cannot_serve(pool):
    with pytest.raises(TypeError, match="serves a LocusRouter; got LocusEmbedder"):
        RouterService(pool[2].embedder_.estimator)
    with pytest.raises(ValueError, match="write_back=True needs the path"):
        RouterService(pool[2], write_back=True)
    with pytest.raises(ValueError, match="max_batch=0 must be a positive integer"):
        RouterService(pool[2], max_batch=0)


# -- the real server ------------------------------------------------------------


def _free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Server:
    """``sklocus serve`` in a subprocess, on a free port of the loopback.

    Its output goes to files, not pipes: at the default log level each request
    writes a line, and a pipe nobody reads fills after some 800 of them, then
    blocks the server (and its workers) mid-write until the pipe is read.
    """

    def __init__(self, *argv, cwd):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, HF_HUB_OFFLINE="1")
        self._stderr = tempfile.TemporaryFile(mode="w+")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sklocus",
                "serve",
                *map(str, argv),
                "--port",
                str(self.port),
            ],
            cwd=cwd,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=self._stderr,
            text=True,
        )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"the server exited: {self.stderr()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.2)
        self.process.kill()
        raise AssertionError("the server did not answer /health within 120 s")

    def stop(self):
        self.process.send_signal(signal.SIGINT)
        try:
            # Longer than a supervisor gives its workers (30 s), so that a
            # worker slow to stop meets the supervisor's kill, not this one's.
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(
                f"the server did not stop within 60 s of SIGINT; it wrote:\n"
                f"{self.stderr()}"
            ) from None
        return self.process.returncode, self.stderr()

    def stderr(self):
        """What the server has written on standard error so far."""
        self._stderr.seek(0)
        return self._stderr.read()


@pytest.fixture(scope="module")
def server(router_file):
    # Every client here comes from 127.0.0.1, as a gateway's requests do: no
    # work budget, which 32 clients routing at once would spend.
    running = Server(
        router_file,
        "--write-back",
        "--max-batch",
        "64",
        "--query-rate-limit",
        "0",
        "--text-rate-limit",
        "0",
        cwd=router_file.parent,
    )
    yield running
    if running.process.poll() is None:
        running.process.kill()


def test_the_server_routes_as_the_router_does(server, pool):
    data, _, router = pool
    queries = data.query_ids[:40]
    response = httpx.post(f"{server.url}/route", json={"queries": queries})
    assert response.status_code == 200
    expected, _ = router.rank_models(queries, k=3)
    assert [r["model"] for r in response.json()["routes"]] == expected[:, 0].tolist()
    bad = httpx.post(f"{server.url}/route", json={"queries": queries * 2})
    assert bad.status_code == 422
    assert _errors(bad) == [
        (("body", "queries"), "80 queries in one request; at most 64")
    ]


def test_concurrent_clients_never_see_a_torn_pool(server, pool, router_file):
    """32 clients route while models are onboarded: each answer is the serial
    answer of the pool before or after some onboarding, never a mix."""
    data, newcomers, router = pool
    queries = data.query_ids[40:72]
    states = [router]
    for i, evaluations in enumerate(newcomers.evaluation_sets[2:6]):
        grown = states[-1].__class__.__new__(states[-1].__class__)
        grown.__dict__.update(states[-1].__dict__)
        grown.add_models([evaluations], [f"onboarded-{i}"], cost=[1.0 + i])
        states.append(grown)
    serial = [
        json.dumps(state.rank_models(queries, k=3)[0].tolist()) for state in states
    ]
    stop = threading.Event()

    def route(_):
        answers = []
        with httpx.Client(base_url=server.url, timeout=60) as session:
            while not stop.is_set() or not answers:
                routes = session.post("/route", json={"queries": queries}).json()
                ranked = [[c["model"] for c in r["top"]] for r in routes["routes"]]
                answers.append(json.dumps(ranked))
        return answers

    with ThreadPoolExecutor(max_workers=32) as clients:
        running = [clients.submit(route, i) for i in range(32)]
        for i, evaluations in enumerate(newcomers.evaluation_sets[2:6]):
            body = {
                "name": f"onboarded-{i}",
                "evaluations": evaluations,
                "cost": 1.0 + i,
            }
            assert (
                httpx.post(f"{server.url}/models", json=body, timeout=60).status_code
                == 201
            )
        stop.set()
        answers = [answer for future in running for answer in future.result()]
    assert len(answers) >= 32
    assert set(answers) <= set(serial), "an answer matched no state of the pool"
    assert serial[-1] in answers or serial[-1] == serial[0]
    # Written back: the file on disk holds the grown pool.
    assert sklocus.load(router_file).classes_[-1] == "onboarded-3"


def test_an_embedder_and_its_pool_table_serve_too(pool, tmp_path):
    """sklocus serve EMBEDDER EVALS builds the router, saves it, and serves it;
    with --group-column, requests give each query's group."""
    data, _, router = pool
    benchmark = dict(zip(data.query_ids, data.benchmarks.tolist()))
    rows = [
        (name, query, score, benchmark[query])
        for name, evaluations in zip(data.model_names, data.evaluation_sets)
        for query, score in evaluations.items()
    ]
    pd.DataFrame(rows, columns=["model", "query", "score", "benchmark"]).to_csv(
        tmp_path / "evals.csv", index=False
    )
    np.save(tmp_path / "vectors.npy", data.query_vectors)
    (tmp_path / "ids.txt").write_text("\n".join(data.query_ids))
    sklocus.save(router.embedder_.estimator, tmp_path / "embedder.sklocus")
    served = Server(
        "embedder.sklocus",
        "evals.csv",
        "--query-vectors",
        "vectors.npy",
        "--query-ids",
        "ids.txt",
        "--router-file",
        "built.sklocus",
        "--write-back",
        "--group-column",
        "benchmark",
        cwd=tmp_path,
    )
    try:
        queries = data.query_ids[:10]
        routes = httpx.post(f"{served.url}/route", json={"queries": queries}).json()
        pool_queries, Y = _pool_table(data)
        unpriced = LocusRouter(FrozenEstimator(router.embedder_.estimator)).fit(
            pool_queries, Y, query_groups=[str(benchmark[q]) for q in pool_queries]
        )
        assert [r["model"] for r in routes["routes"]] == unpriced.predict(
            queries
        ).tolist()
        # The integer column's labels are served as text.
        groups = [str(benchmark[q]) for q in queries]
        health = httpx.get(f"{served.url}/health").json()
        assert sorted(health["groups"]) == ["0", "1", "2", "3", "4"]
        body = {"queries": queries, "query_groups": groups}
        grouped = httpx.post(f"{served.url}/route", json=body).json()["routes"]
        models, p = unpriced.rank_models(queries, k=3, query_groups=groups)
        assert [[c["model"] for c in r["top"]] for r in grouped] == models.tolist()
        listed = [[c["p"] for c in r["top"]] for r in grouped]
        np.testing.assert_allclose(listed, p, rtol=1e-5)
        assert httpx.delete(f"{served.url}/models/model-0003").status_code == 200
        assert "model-0003" not in sklocus.load(tmp_path / "built.sklocus").classes_
    finally:
        status, stderr = served.stop()
    assert status == 0, stderr
    assert "Saved the router of 16 models to built.sklocus" in stderr
    assert "Serving 16 models with 5 query groups" in stderr


def _pool_table(data):
    scores, queries = to_matrix(data.evaluation_sets)
    return queries, pd.DataFrame(scores, columns=data.model_names)


def test_the_server_shuts_down_cleanly(server):
    status, stderr = server.stop()
    assert status == 0, stderr
    assert "Traceback" not in stderr
    assert "Shutting down" in stderr
